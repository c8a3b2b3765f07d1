//! `sluice array`: distributed arrays stored as Zarr v3 (Panda on sluice).
//! `write` and `read` run a collective of N ranks (threads, one
//! connection each) by the plan of `sluice-array`; `info`, `ls`, `cat` and
//! `verify` read any Zarr v3 array through zarrs.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};
use serde_json::json;
use sluice_array::{aggregators, place, plan, Dist, Distribution, Dtype, Layout, Placement, PlacementInput, Plan, PlanLimits};
use sluice_remote::Remote;
use sluice_zarr::collective::{self, pattern_local, ArraySpec, Collective, Strategy, Transfer};
use sluice_zarr::inspect::{self, PATTERN_ATTRIBUTE};
use sluice_zarr::migrate;

use super::remote::{connect, remote_path};

#[derive(Subcommand)]
pub enum ArrayCmd {
    /// Write the test pattern (element = its linear index) as a distributed array, collectively.
    Write(WriteArgs),
    /// Read an array collectively into distributed ranks and check the test pattern.
    Read(ReadArgs),
    /// Schema, layout, size and per-server placement of an array or group.
    Info(PathArgs),
    /// The arrays and groups under a group.
    Ls(PathArgs),
    /// Print an array's elements (a region of it with --region 0:4,2,:).
    Cat(CatArgs),
    /// Decode every element, print a CRC32C of the array in C order, check the test pattern.
    Verify(PathArgs),
    /// Move a finished group (a timestep) or array to a slower tier, at background priority; reads of the old path follow it.
    Migrate(MigrateArgs),
}

#[derive(Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    at: PathArgs,
    /// Where to: a new or empty directory, written :PATH.
    #[arg(long)]
    to: String,
    /// The tier's server or cluster, when it is not the source's.
    #[arg(long)]
    to_server: Option<String>,
    /// QoS weight of the copy's connections: 0 (the default) is the background class, served once the others have left the device idle for 10 ms (and one request per second under load).
    #[arg(long, default_value_t = 0)]
    weight: u32,
    /// Keep the source's data (only the mark that points reads to the copy is written).
    #[arg(long)]
    keep: bool,
}

#[derive(Args)]
pub struct PathArgs {
    /// Server address: one server or a cluster (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// The array or group, written :PATH.
    path: String,
}

#[derive(Args)]
pub struct CatArgs {
    #[command(flatten)]
    at: PathArgs,
    /// Python-style region, one entry per dimension: `lo:hi`, `i` or `:`.
    #[arg(long, default_value = "")]
    region: String,
}

/// How the ranks hold the array in memory.
#[derive(Args, Clone)]
pub struct DistArgs {
    /// Processes per dimension (default: --ranks on the first, 1 elsewhere).
    #[arg(long, value_delimiter = ',')]
    pub grid: Vec<u64>,
    /// Ranks, when --grid is not given.
    #[arg(long, default_value_t = 4)]
    pub ranks: u64,
    /// HPF distribution per dimension: block, cyclic, cyclic(K), gen_block(B0:B1:...) (one block size per process: uneven data) or * (default: block where the grid has more than one process, else *).
    #[arg(long, value_delimiter = ',')]
    pub dist: Vec<String>,
    /// Collective strategy: independent (each rank's list I/O), two-phase (aggregators move whole files), server-directed (the server gathers each file's pieces from every rank and serves them in disk order), or auto (the cost model, measured against the server first, chooses).
    #[arg(long, default_value = "independent")]
    pub strategy: String,
    /// Server-directed: how long the server waits for the last rank of a group (it clamps this to its own bound).
    #[arg(long, default_value_t = collective::GROUP_WAIT_MS_DEFAULT)]
    pub group_wait_ms: u32,
    /// Server-directed: messages a rank keeps in flight (1 to 4; more overlaps sending with the server's work).
    #[arg(long, default_value_t = 1)]
    pub group_window: usize,
    /// Hosts the ranks and servers are spread over, for placement: rank r and server s on hosts r % H and s % H (default: one per server).
    #[arg(long)]
    pub hosts: Option<usize>,
    /// Each data server's share of the files, e.g. 1,1,2 for a server twice as fast; `measure` (each server's write bandwidth, measured first); or each server's calibrated device model, A.toml,B.toml,... (`sluice calibrate --out`; its throughput at the chunk size); default: equal.
    #[arg(long, value_delimiter = ',')]
    pub server_weights: Vec<String>,
}

#[derive(Args)]
pub struct WriteArgs {
    #[command(flatten)]
    at: PathArgs,
    /// Array shape, e.g. 256,256,128.
    #[arg(long, value_delimiter = ',', required = true)]
    shape: Vec<u64>,
    /// Element type: float64, float32, int64, int32, int16, uint8, ...
    #[arg(long, default_value = "float64")]
    dtype: String,
    /// Chunk shape on disk (default: the shape).
    #[arg(long, value_delimiter = ',')]
    chunks: Vec<u64>,
    /// Shard shape (a multiple of the chunks): chunks grouped into one file per shard.
    #[arg(long, value_delimiter = ',')]
    shards: Vec<u64>,
    /// Dimension names (default: dim_0, dim_1, ...).
    #[arg(long, value_delimiter = ',')]
    dims: Vec<String>,
    #[command(flatten)]
    dist: DistArgs,
    /// Also write, as JSON, the list messages every rank sends, in its
    /// order: `{"ranks": [[{"file", "j", "ranges", "group"}, ...], ...]}`,
    /// a server-directed group as `[id, participants]` with ids relative
    /// to the collective's base (the same messages `sluice.array` sends
    /// for the same plan).
    #[arg(long)]
    messages: Option<std::path::PathBuf>,
}

#[derive(Args)]
pub struct ReadArgs {
    #[command(flatten)]
    at: PathArgs,
    #[command(flatten)]
    dist: DistArgs,
}

pub fn run(c: ArrayCmd) -> anyhow::Result<()> {
    match c {
        ArrayCmd::Write(a) => write(a),
        ArrayCmd::Read(a) => read(a),
        ArrayCmd::Info(a) => print(&a, inspect::info),
        ArrayCmd::Ls(a) => print(&a, inspect::ls),
        ArrayCmd::Cat(a) => {
            let (remote, path) = open(&a.at)?;
            print!("{}", inspect::cat(remote, &path, &a.region)?);
            Ok(())
        }
        ArrayCmd::Migrate(a) => migrate(a),
        ArrayCmd::Verify(a) => {
            let (remote, path) = open(&a)?;
            let v = inspect::verify(remote, &path)?;
            println!("{path}: {} elements, crc32c {:08x}", v.elements, v.crc32c);
            match v.pattern_mismatches {
                Some(0) => println!("test pattern: every element matches"),
                Some(n) => bail!("test pattern: {n} of {} elements differ", v.elements),
                None => println!("(no test pattern to check)"),
            }
            Ok(())
        }
    }
}

/// The server and path to read `a` at: a migrated group or array is read
/// where it went (`sluice_zarr::migrate::resolve`).
fn open(a: &PathArgs) -> anyhow::Result<(Arc<Remote>, String)> {
    let (_, remote, path) = open_at(a)?;
    Ok((remote, path))
}

fn open_at(a: &PathArgs) -> anyhow::Result<(String, Arc<Remote>, String)> {
    let path = remote_path(&a.path).ok_or_else(|| anyhow!("{:?} is not on the server (write :PATH)", a.path))?;
    let addr = sluice_client::server_addr(a.server.as_deref())?;
    let remote = Arc::new(connect(Some(&addr))?);
    Ok(migrate::resolve(&addr, remote, path)?)
}

fn migrate(a: MigrateArgs) -> anyhow::Result<()> {
    let path = remote_path(&a.at.path).ok_or_else(|| anyhow!("{:?} is not on the server (write :PATH)", a.at.path))?;
    let to = remote_path(&a.to).ok_or_else(|| anyhow!("--to {:?}: write :PATH", a.to))?;
    let addr = sluice_client::server_addr(a.at.server.as_deref())?;
    let opts = || sluice_client::ConnectOptions { weight: a.weight, ..migrate::background() };
    let src = Remote::connect_with(&addr, opts()).with_context(|| format!("connecting to {addr}"))?;
    let dst = match &a.to_server {
        Some(s) => Some(Remote::connect_with(s, opts()).with_context(|| format!("connecting to {s}"))?),
        None => None,
    };
    let target = migrate::Target { addr: a.to_server.clone(), path: to.to_string() };
    let m = migrate::migrate(&src, path, dst.as_ref().unwrap_or(&src), &target, a.keep)?;
    let secs = m.elapsed.as_secs_f64();
    println!(
        "migrated {path} to {}:{to}: {} files, {} bytes in {secs:.2} s ({:.1} MiB/s, weight {}); {} source files removed",
        a.to_server.as_deref().unwrap_or(""),
        m.files,
        m.bytes,
        m.bytes as f64 / (1 << 20) as f64 / secs.max(1e-9),
        a.weight,
        m.removed
    );
    Ok(())
}

fn print(a: &PathArgs, f: fn(Arc<Remote>, &str) -> Result<String, sluice_zarr::Error>) -> anyhow::Result<()> {
    let (remote, path) = open(a)?;
    print!("{}", f(remote, &path)?);
    Ok(())
}

/// Everything a collective needs, computed once.
pub struct Prepared {
    pub spec: ArraySpec,
    pub dist: Distribution,
    pub plan: Plan,
    pub placement: Placement,
    pub aggregator: Vec<usize>,
    pub strategy: Strategy,
    pub group_wait_ms: u32,
    pub group_window: usize,
}

impl Prepared {
    /// `weights`: each data server's share (empty: equal); `held`: the
    /// bytes each already holds of the array's group (empty: none).
    pub fn new(spec: ArraySpec, d: &DistArgs, servers: usize, weights: &[f64], held: &[u64]) -> anyhow::Result<Prepared> {
        let shape = spec.layout.shape().to_vec();
        let n = shape.len();
        let grid = if d.grid.is_empty() {
            let mut g = vec![1; n];
            g[0] = d.ranks;
            g
        } else {
            d.grid.clone()
        };
        let dists: Vec<Dist> = if d.dist.is_empty() {
            grid.iter().map(|&g| if g > 1 { Dist::Block } else { Dist::Star }).collect()
        } else {
            d.dist.iter().map(|s| Dist::parse(s)).collect::<Result<_, _>>()?
        };
        let dist = Distribution::new(shape, grid, dists)?;
        let plan = plan(&dist, &spec.layout, &PlanLimits::default())?;
        let hosts = d.hosts.unwrap_or(servers).max(1);
        let rank_host: Vec<usize> = (0..dist.ranks() as usize).map(|r| r % hosts).collect();
        let server_host: Vec<usize> = (0..servers).map(|s| s % hosts).collect();
        let bytes = plan.unit_rank_bytes(spec.layout.units(), dist.ranks());
        let weights = if weights.is_empty() { vec![1.0; servers] } else { weights.to_vec() };
        if weights.len() != servers {
            bail!("{} server weights for {servers} data servers", weights.len());
        }
        let placement = place(&PlacementInput {
            unit_rank_bytes: &bytes,
            rank_host: &rank_host,
            server_host: &server_host,
            server_weight: &weights,
            server_held_bytes: held,
            hungarian_units_max: sluice_array::PLACEMENT_HUNGARIAN_UNITS_MAX,
        })?;
        let aggregator = aggregators(&bytes, &rank_host, &server_host, &placement.unit_server);
        // `auto` is resolved by `Prepared::choose`, once the plan exists.
        let strategy = if d.strategy == "auto" { Strategy::Independent } else { Strategy::parse(&d.strategy)? };
        Ok(Prepared { spec, dist, plan, placement, aggregator, strategy, group_wait_ms: d.group_wait_ms, group_window: d.group_window })
    }

    pub fn collective<'a>(&'a self, addr: &'a str) -> Collective<'a> {
        Collective {
            addr,
            spec: &self.spec,
            dist: &self.dist,
            plan: &self.plan,
            unit_server: &self.placement.unit_server,
            unit_aggregator: &self.aggregator,
            strategy: self.strategy,
            group_wait_ms: self.group_wait_ms,
            group_window: self.group_window,
        }
    }

    /// What the cost model needs of this collective.
    pub fn shape(&self, servers: usize) -> sluice_zarr::model::Shape<'_> {
        sluice_zarr::model::Shape { plan: &self.plan, layout: &self.spec.layout, dist: &self.dist, unit_server: &self.placement.unit_server, servers }
    }

    /// With `--strategy auto`: measure the model's parameters against
    /// `addr` and take the strategy it predicts fastest, saying so.
    pub fn choose(&mut self, addr: &str, servers: usize) -> anyhow::Result<()> {
        let m = sluice_zarr::model::calibrate(addr, &format!("{}.sluice", self.spec.path), sluice_zarr::model::CalibrateOptions::QUICK)?;
        let (best, all) = sluice_zarr::model::choose(&self.shape(servers), &m);
        let list: Vec<String> = all.iter().map(|(s, t)| format!("{} {:.2} ms", s.name(), t * 1e3)).collect();
        println!("strategy auto: {} (predicted: {})", best.name(), list.join(", "));
        self.strategy = best;
        Ok(())
    }

    pub fn describe(&self) -> String {
        let dists: Vec<String> = self.dist.dists().iter().map(|d| d.to_string()).collect();
        format!(
            "{} ranks, grid {:?}, ({}); {} files; {} pieces; placement by {:?}: {:.0}% of bytes on their server's host",
            self.dist.ranks(),
            self.dist.grid(),
            dists.join(", "),
            self.spec.layout.units(),
            self.plan.pieces().len(),
            self.placement.method,
            100.0 * self.placement.local_bytes as f64 / self.placement.total_bytes.max(1) as f64
        )
    }
}

/// The data servers' shares from `--server-weights`: given, measured, or
/// (empty) equal.
fn server_weights(remote: &Remote, addr: &str, arg: &[String], path: &str, unit_bytes: u64) -> anyhow::Result<Vec<f64>> {
    match arg {
        [] => Ok(Vec::new()),
        [m] if m == "measure" => {
            let w = sluice_zarr::model::server_bandwidths(addr, &format!("{path}.sluice"))?;
            let shown: Vec<String> = w.iter().map(|b| format!("{:.0} MiB/s", b / (1 << 20) as f64)).collect();
            println!("server weights (measured write bandwidth): {}", shown.join(", "));
            Ok(w)
        }
        given if given.iter().all(|x| x.ends_with(".toml")) => {
            let w = given
                .iter()
                .map(|f| sluice_device::ModelFile::load(std::path::Path::new(f)).map(|m| model_bandwidth(&m, unit_bytes)).map_err(|e| anyhow!("--server-weights {f}: {e}")))
                .collect::<anyhow::Result<Vec<f64>>>()?;
            check_count(remote, &w)?;
            let shown: Vec<String> = w.iter().map(|b| format!("{:.0} MiB/s", b / (1 << 20) as f64)).collect();
            println!("server weights (calibrated models, {} KiB transfers): {}", unit_bytes / 1024, shown.join(", "));
            Ok(w)
        }
        given => {
            let w = given.iter().map(|x| x.parse::<f64>().ok().filter(|w| w.is_finite() && *w > 0.0)).collect::<Option<Vec<f64>>>();
            let w = w.ok_or_else(|| anyhow!("--server-weights takes positive numbers, one per data server, `measure`, or one model file (.toml) per data server"))?;
            check_count(remote, &w)?;
            Ok(w)
        }
    }
}

fn check_count(remote: &Remote, w: &[f64]) -> anyhow::Result<()> {
    if w.len() != servers_of(remote) {
        bail!("--server-weights gives {} weights for {} data servers", w.len(), servers_of(remote));
    }
    Ok(())
}

/// Bytes per second a device of model `m` moves in transfers of `bytes`,
/// its `parallelism` at once (the scheduling issue's cost model: a fixed
/// cost per dispatch plus a cost per byte).
fn model_bandwidth(m: &sluice_device::ModelFile, bytes: u64) -> f64 {
    let ns = m.dispatch_ns as f64 + bytes as f64 * m.byte_ps as f64 / 1e3;
    bytes as f64 * 1e9 / ns.max(1.0) * f64::from(m.parallelism.max(1))
}

/// Most files of a group counted for [`group_held_bytes`]; past it the
/// count stops (placement then balances on what was counted).
const GROUP_FILES_COUNTED_MAX: usize = 1 << 16;

/// On a cluster: the bytes each data server holds of the group (the
/// parent directory) of the array at `path`, its other arrays' data
/// files; empty on one server.
fn group_held_bytes(remote: &Remote, path: &str) -> anyhow::Result<Vec<u64>> {
    let Remote::Cluster(k) = remote else { return Ok(Vec::new()) };
    let mut held = vec![0u64; k.striped().servers().len()];
    // An array at the top has no group: the whole namespace is not one.
    let Some((parent, _)) = path.rsplit_once('/') else { return Ok(held) };
    let parent = parent.to_string();
    let (mut todo, mut files) = (vec![parent], 0usize);
    while let Some(dir) = todo.pop() {
        let entries = match remote.readdir(&dir) {
            Ok(e) => e,
            Err(e) if e.posix_errno() == libc::ENOENT => continue,
            Err(e) => return Err(anyhow!("{dir}: {e}")),
        };
        for e in entries {
            let child = if dir.is_empty() { e.name.clone() } else { format!("{dir}/{}", e.name) };
            if child == path {
                continue;
            }
            match e.kind {
                sluice_client::FileKind::Dir => todo.push(child),
                // The data files: metadata is small and placed by the
                // cluster's default layout, not by this placement.
                sluice_client::FileKind::File if e.name != "zarr.json" => {
                    files += 1;
                    if files > GROUP_FILES_COUNTED_MAX {
                        return Ok(held);
                    }
                    let (_, objects) = k.striped().objects(&child).map_err(|e| anyhow!("{child}: {e}"))?;
                    for o in objects {
                        held[o.server as usize] += o.size.unwrap_or(0);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(held)
}

/// Servers behind a sluice address (1 for a single server).
pub fn servers_of(remote: &Remote) -> usize {
    remote.servers()
}

pub fn rate(t: &Transfer) -> String {
    format!("{:.1} MiB/s ({} bytes in {:.3} s)", t.bytes as f64 / (1 << 20) as f64 / t.elapsed.as_secs_f64().max(1e-9), t.bytes, t.elapsed.as_secs_f64())
}

fn write(a: WriteArgs) -> anyhow::Result<()> {
    // A write goes where it is told: no migration mark is followed.
    let path = remote_path(&a.at.path).ok_or_else(|| anyhow!("{:?} is not on the server (write :PATH)", a.at.path))?.trim_matches('/').to_string();
    let remote = Arc::new(connect(a.at.server.as_deref())?);
    let addr = sluice_client::server_addr(a.at.server.as_deref())?;
    let chunks = if a.chunks.is_empty() { a.shape.clone() } else { a.chunks };
    let shards = (!a.shards.is_empty()).then_some(a.shards);
    let layout = Layout::new(a.shape.clone(), Dtype::parse(&a.dtype)?, chunks, shards)?;
    let dims = if a.dims.is_empty() { (0..a.shape.len()).map(|d| format!("dim_{d}")).collect() } else { a.dims };
    if dims.len() != a.shape.len() {
        bail!("--dims names {} dimensions, the shape has {}", dims.len(), a.shape.len());
    }
    let spec = ArraySpec { path: path.clone(), layout, dims, attributes: json!({ PATTERN_ATTRIBUTE: "linear-index" }) };
    let weights = server_weights(&remote, &addr, &a.dist.server_weights, &path, spec.layout.chunk_bytes())?;
    let held = group_held_bytes(&remote, &path)?;
    let mut p = Prepared::new(spec, &a.dist, servers_of(&remote), &weights, &held)?;
    println!("{path}: {}", p.describe());
    collective::create(remote.clone(), &p.spec).with_context(|| format!("create {path}"))?;
    if a.dist.strategy == "auto" {
        p.choose(&addr, servers_of(&remote))?;
    }
    if let Some(out) = &a.messages {
        std::fs::write(out, messages_json(&p).to_string()).with_context(|| format!("writing {}", out.display()))?;
    }
    let locals: Vec<Vec<u8>> = (0..p.dist.ranks()).map(|r| pattern_local(&p.dist, p.spec.layout.dtype(), r)).collect();
    let t = collective::write(&p.collective(&addr), &locals)?;
    println!("write ({}): {}", p.strategy.name(), rate(&t));
    Ok(())
}

/// Every rank's list messages as `--messages` writes them.
fn messages_json(p: &Prepared) -> serde_json::Value {
    let limits = &collective::MESSAGE_LIMITS;
    let groups = (p.strategy == Strategy::ServerDirected).then(|| sluice_array::Groups::new(&p.plan, p.spec.layout.units(), limits, 0));
    let ranks: Vec<serde_json::Value> = (0..p.dist.ranks())
        .map(|r| {
            let msgs = sluice_array::rank_messages(&p.plan, r, limits, groups.as_ref());
            msgs.into_iter().flatten().map(|m| json!({ "file": m.unit, "j": m.j, "ranges": m.ranges(), "group": m.group.map(|t| (t.id, t.participants)) })).collect()
        })
        .collect();
    json!({ "ranks": ranks })
}

/// Refuse an array whose shards hold their inner chunks elsewhere than
/// sluice's fixed offsets (`Layout::check_shard_index`: zarr-python's
/// shards carry the same metadata, and their chunks were read from the
/// wrong places without an error). A shard never written reads as the
/// fill value.
fn check_shard_indexes(remote: &Remote, path: &str, layout: &Layout) -> anyhow::Result<()> {
    if layout.shard().is_none() {
        return Ok(());
    }
    for u in 0..layout.units() {
        let p = format!("{}/{}", path.trim_matches('/'), layout.key(u));
        let fd = match remote.open(&p, libc::O_RDONLY, 0) {
            Err(e) if e.errno == libc::ENOENT => continue,
            other => other.with_context(|| format!("opening {p}"))?,
        };
        let read = (|| -> Result<(u64, Vec<u8>), sluice_client::ClientError> {
            let size = remote.fstat(fd)?.size;
            let want = layout.shard_index(u).len();
            let mut tail = vec![0u8; want];
            let n = if size >= want as u64 { remote.pread(fd, &mut tail, size - want as u64)? } else { 0 };
            tail.truncate(n);
            Ok((size, tail))
        })();
        let _ = remote.close(fd);
        let (size, tail) = read.with_context(|| format!("reading {p}'s shard index"))?;
        layout.check_shard_index(u, size, &tail).map_err(|m| anyhow!("{p}: {m}"))?;
    }
    Ok(())
}

fn read(a: ReadArgs) -> anyhow::Result<()> {
    let (addr, remote, path) = open_at(&a.at)?;
    let meta = inspect::zarr_json(remote.clone(), &path)?;
    let layout = Layout::from_zarr_json(&meta)?;
    check_shard_indexes(&remote, &path, &layout)?;
    let dims = meta["dimension_names"].as_array().map(|v| v.iter().map(|d| d.as_str().unwrap_or("").to_string()).collect()).unwrap_or_default();
    let spec = ArraySpec { path: path.clone(), layout, dims, attributes: meta["attributes"].clone() };
    let weights = server_weights(&remote, &addr, &a.dist.server_weights, &path, spec.layout.chunk_bytes())?;
    let mut p = Prepared::new(spec, &a.dist, servers_of(&remote), &weights, &[])?;
    println!("{path}: {}", p.describe());
    if a.dist.strategy == "auto" {
        p.choose(&addr, servers_of(&remote))?;
    }
    let (locals, t) = collective::read(&p.collective(&addr))?;
    println!("read ({}): {}", p.strategy.name(), rate(&t));
    if meta["attributes"][PATTERN_ATTRIBUTE] == "linear-index" {
        let bad: Vec<u64> = (0..p.dist.ranks()).filter(|&r| locals[r as usize] != pattern_local(&p.dist, p.spec.layout.dtype(), r)).collect();
        if !bad.is_empty() {
            bail!("ranks {bad:?} read data that differs from the test pattern");
        }
        println!("test pattern: every rank's data matches");
    }
    Ok(())
}
