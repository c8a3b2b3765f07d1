//! One module per subcommand.

pub mod array;
pub mod bench;
pub mod bench_array;
pub mod bench_matrix;
pub mod bench_forwarders;
pub mod bench_meta;
pub mod bench_qos;
pub mod bench_scaleout;
pub mod bench_service;
pub mod calibrate;
pub mod cluster;
pub mod cp;
pub mod darshan;
pub mod ls;
pub mod man;
pub mod mount;
pub mod output;
pub mod remote;
pub mod run;
pub mod serve;
pub mod sim;
pub mod size;
pub mod stripe;
pub mod top;
pub mod whatif;
pub mod workload;
