//! What `sluice array info|ls|cat|verify` show, in the spirit of `h5ls`
//! and `zarr info`. Data is read through zarrs, so these work on any Zarr
//! v3 array on a sluice address, not only on the ones sluice wrote.

use std::sync::Arc;

use serde_json::Value;
use sluice_array::{Dtype, Layout};
use sluice_remote::Remote;
use zarrs::array::{Array, ArrayBytes, ArraySubset};
use zarrs::storage::{ListableStorageTraits, ReadableStorageTraits, StoreKey, StorePrefix};

use crate::collective::pattern_value;
use crate::{Error, SluiceStore};

/// The most elements `cat` prints; a larger region is refused with a hint.
pub const CAT_ELEMENTS_MAX: u64 = 100_000;

/// The attribute that marks an array written with the test pattern
/// (element = its C-order linear index), so that `verify` can check it.
pub const PATTERN_ATTRIBUTE: &str = "sluice_pattern";

fn metadata(store: &SluiceStore, path: &str) -> Result<Value, Error> {
    let key = StoreKey::new(format!("{}/zarr.json", path.trim_matches('/')).trim_start_matches('/')).map_err(Error::other)?;
    let bytes = store.get(&key).map_err(Error::other)?.ok_or_else(|| Error::new(format!("{path}: no zarr.json (not a Zarr v3 array or group)")))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::new(format!("{path}/zarr.json: {e}")))
}

/// The `zarr.json` of the array or group at `path`.
pub fn zarr_json(remote: Arc<Remote>, path: &str) -> Result<Value, Error> {
    metadata(&SluiceStore::new(remote, ""), path)
}

fn open(store: Arc<SluiceStore>, path: &str) -> Result<Array<SluiceStore>, Error> {
    Array::open(store, &format!("/{}", path.trim_matches('/'))).map_err(|e| Error::new(format!("{path}: {e}")))
}

/// `sluice array info`: the schema, the layout and where the files are.
pub fn info(remote: Arc<Remote>, path: &str) -> Result<String, Error> {
    let store = Arc::new(SluiceStore::new(remote.clone(), ""));
    let meta = metadata(&store, path)?;
    let mut out = String::new();
    let line = |out: &mut String, k: &str, v: String| out.push_str(&format!("{k:<12} {v}\n"));
    line(&mut out, "path", path.to_string());
    line(&mut out, "node", meta["node_type"].as_str().unwrap_or("?").to_string());
    if meta["node_type"] != "array" {
        line(&mut out, "attributes", meta["attributes"].to_string());
        return Ok(out);
    }
    let array = open(store.clone(), path)?;
    line(&mut out, "shape", format!("{:?}", array.shape()));
    line(&mut out, "dtype", meta["data_type"].to_string().trim_matches('"').to_string());
    line(&mut out, "dims", meta["dimension_names"].to_string());
    line(&mut out, "files", format!("{:?} (grid of chunks or shards: {:?})", array.chunk_grid_shape().iter().product::<u64>(), array.chunk_grid_shape()));
    let codecs: Vec<String> = meta["codecs"].as_array().into_iter().flatten().map(|c| c["name"].as_str().unwrap_or("?").to_string()).collect();
    line(&mut out, "codecs", codecs.join(", "));
    match Layout::from_zarr_json(&meta) {
        Ok(l) => {
            let shard = l.shard().map(|s| format!(", shards {s:?} ({} B index)", l.index_bytes())).unwrap_or_default();
            line(&mut out, "layout", format!("fixed offsets: chunks {:?} ({} B){shard}", l.chunk(), l.chunk_bytes()));
        }
        Err(e) => line(&mut out, "layout", e.message),
    }
    let prefix = StorePrefix::new(format!("{}/", path.trim_matches('/'))).map_err(Error::other)?;
    line(&mut out, "bytes", store.size_prefix(&prefix).map_err(Error::other)?.to_string());
    if let Remote::Cluster(k) = remote.as_ref() {
        // The data files (keys under c/), not the metadata.
        let mut per_server = vec![0u64; k.striped().servers().len()];
        let chunks = StorePrefix::new(format!("{}/c/", path.trim_matches('/'))).map_err(Error::other)?;
        for key in store.list_prefix(&chunks).map_err(Error::other)? {
            let (_, objects) = k.striped().objects(key.as_str()).map_err(|e| Error::client(key.as_str(), e.into()))?;
            for o in objects {
                per_server[o.server as usize] += o.size.unwrap_or(0);
            }
        }
        let total: u64 = per_server.iter().sum::<u64>().max(1);
        let shares: Vec<String> = per_server.iter().enumerate().map(|(s, b)| format!("server {s}: {b} B ({:.0}%)", 100.0 * *b as f64 / total as f64)).collect();
        line(&mut out, "placement", shares.join(", "));
    }
    line(&mut out, "attributes", meta["attributes"].to_string());
    Ok(out)
}

/// `sluice array ls`: the arrays and groups directly under a group.
pub fn ls(remote: Arc<Remote>, path: &str) -> Result<String, Error> {
    let store = SluiceStore::new(remote, "");
    let dir = path.trim_matches('/');
    let prefix = StorePrefix::new(if dir.is_empty() { String::new() } else { format!("{dir}/") }).map_err(Error::other)?;
    let children = store.list_dir(&prefix).map_err(Error::other)?;
    let mut out = String::new();
    for p in children.prefixes() {
        let child = p.as_str().trim_end_matches('/');
        let name = child.rsplit('/').next().unwrap_or(child);
        match metadata(&store, child) {
            Ok(m) if m["node_type"] == "array" => out.push_str(&format!("{name:<24} array  {} {}\n", m["shape"], m["data_type"].as_str().unwrap_or("?"))),
            Ok(_) => out.push_str(&format!("{name:<24} group\n")),
            Err(_) => {}
        }
    }
    Ok(out)
}

/// Parse `lo:hi,i,:` against `shape` (Python-style slices, no steps).
pub fn parse_region(s: &str, shape: &[u64]) -> Result<Vec<std::ops::Range<u64>>, Error> {
    if s.is_empty() {
        return Ok(shape.iter().map(|&n| 0..n).collect());
    }
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() != shape.len() {
        return Err(Error::new(format!("region {s:?} has {} dimensions, the array {}", parts.len(), shape.len())));
    }
    parts
        .iter()
        .zip(shape)
        .map(|(p, &n)| {
            let num = |t: &str, default: u64| -> Result<u64, Error> {
                if t.is_empty() {
                    Ok(default)
                } else {
                    t.trim().parse().map_err(|_| Error::new(format!("{t:?} in region {s:?} is not an index")))
                }
            };
            let r = match p.split_once(':') {
                Some((a, b)) => num(a, 0)?..num(b, n)?,
                None => {
                    let i = num(p, 0)?;
                    i..i + 1
                }
            };
            if r.start >= r.end || r.end > n {
                return Err(Error::new(format!("{p:?} is empty or outside 0..{n}")));
            }
            Ok(r)
        })
        .collect()
}

fn format_element(dtype: Option<Dtype>, b: &[u8]) -> String {
    match dtype {
        Some(Dtype::F64) => f64::from_le_bytes(b.try_into().unwrap_or([0; 8])).to_string(),
        Some(Dtype::F32) => f32::from_le_bytes(b.try_into().unwrap_or([0; 4])).to_string(),
        Some(Dtype::I16 | Dtype::I32 | Dtype::I64) => {
            let mut v = [0u8; 8];
            v[..b.len()].copy_from_slice(b);
            let shift = 64 - 8 * b.len() as u32;
            ((i64::from_le_bytes(v) << shift) >> shift).to_string()
        }
        Some(_) => {
            let mut v = [0u8; 8];
            v[..b.len()].copy_from_slice(b);
            u64::from_le_bytes(v).to_string()
        }
        None => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

fn retrieve(array: &Array<SluiceStore>, ranges: &[std::ops::Range<u64>]) -> Result<Vec<u8>, Error> {
    let bytes: ArrayBytes<'static> = array.retrieve_array_subset(&ArraySubset::new_with_ranges(ranges)).map_err(Error::other)?;
    Ok(bytes.into_fixed().map_err(Error::other)?.into_owned())
}

/// `sluice array cat`: the region's elements, one row of the last
/// dimension per line.
pub fn cat(remote: Arc<Remote>, path: &str, region: &str) -> Result<String, Error> {
    let store = Arc::new(SluiceStore::new(remote, ""));
    let meta = metadata(&store, path)?;
    let array = open(store, path)?;
    let ranges = parse_region(region, array.shape())?;
    let count: u64 = ranges.iter().map(|r| r.end - r.start).product();
    if count > CAT_ELEMENTS_MAX {
        return Err(Error::new(format!("the region has {count} elements, more than {CAT_ELEMENTS_MAX}; narrow it with --region")));
    }
    let dtype = Dtype::parse(meta["data_type"].as_str().unwrap_or("")).ok();
    let data = retrieve(&array, &ranges)?;
    let el = data.len() / count as usize;
    let row = (ranges.last().map(|r| r.end - r.start).unwrap_or(1)) as usize;
    let mut out = String::new();
    for line in data.chunks(el * row) {
        let v: Vec<String> = line.chunks(el).map(|b| format_element(dtype, b)).collect();
        out.push_str(&v.join(" "));
        out.push('\n');
    }
    Ok(out)
}

/// What `verify` found.
#[derive(Debug, Clone)]
pub struct Verified {
    pub elements: u64,
    /// CRC32C of the elements in C order, as numpy's `tobytes()` gives them.
    pub crc32c: u32,
    /// Elements that differ from the test pattern, when the array carries it.
    pub pattern_mismatches: Option<u64>,
}

/// `sluice array verify`: decode every element through zarrs, checksum the
/// array in C order, and check the test pattern if the array carries it.
pub fn verify(remote: Arc<Remote>, path: &str) -> Result<Verified, Error> {
    let store = Arc::new(SluiceStore::new(remote, ""));
    let meta = metadata(&store, path)?;
    let array = open(store, path)?;
    let shape = array.shape().to_vec();
    let dtype = Dtype::parse(meta["data_type"].as_str().unwrap_or("")).ok();
    let pattern = meta["attributes"][PATTERN_ATTRIBUTE] == "linear-index";
    // Slabs along the first dimension, one file high, are contiguous in
    // C order: checksum them in turn.
    let step = array.chunk_shape(&vec![0; shape.len()]).map_err(Error::other)?[0].get();
    let (mut crc, mut mismatches, mut seen) = (0u32, 0u64, 0u64);
    let mut lo = 0;
    while lo < shape[0] {
        let hi = (lo + step).min(shape[0]);
        let mut ranges: Vec<std::ops::Range<u64>> = shape.iter().map(|&n| 0..n).collect();
        ranges[0] = lo..hi;
        let data = retrieve(&array, &ranges)?;
        crc = crc32c::crc32c_append(crc, &data);
        if let (true, Some(d)) = (pattern, dtype) {
            let el = d.bytes() as usize;
            let mut want = vec![0u8; el];
            for (i, got) in data.chunks(el).enumerate() {
                pattern_value(d, seen + i as u64, &mut want);
                mismatches += u64::from(got != want.as_slice());
            }
        }
        seen += (data.len() / dtype.map(|d| d.bytes() as usize).unwrap_or(1)) as u64;
        lo = hi;
    }
    Ok(Verified { elements: shape.iter().product(), crc32c: crc, pattern_mismatches: (pattern && dtype.is_some()).then_some(mismatches) })
}
