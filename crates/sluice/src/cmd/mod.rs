//! One module per subcommand.

pub mod bench;
pub mod mount;
pub mod output;
pub mod workload;
pub mod sim;
pub mod serve;
pub mod cp;
pub mod ls;
pub mod remote;
pub mod run;
pub mod bench_service;
pub mod cluster;
pub mod stripe;
