//! An array on disk as a Zarr v3 array with fixed offsets.
//!
//! sluice stores an array as Zarr v3 so that zarr-python and xarray read it
//! without sluice. It picks the subset of Zarr in which every element has
//! one file and one byte offset known in advance, so a collective write is
//! plain list I/O that the scheduler can order and aggregate:
//!
//! - chunks are uncompressed (the `bytes` codec, little endian), so a
//!   chunk file is its elements in C order, edge chunks padded to the full
//!   chunk shape;
//! - with shards (the `sharding_indexed` codec), the inner chunk `i` of a
//!   shard (C order over the shard's chunks) sits at `i * chunk_bytes`, and
//!   the index (an offset and a length per inner chunk, little-endian u64,
//!   then its CRC32C) sits at the end. Inner chunks wholly outside the
//!   array are marked missing (`u64::MAX` twice) and read as the fill value.
//!
//! A file of the array is a "unit": a chunk without shards, else a shard.

use serde_json::{json, Value};

use crate::{invalid, limit, ravel, unravel, Error, DIMS_MAX, UNITS_MAX};

/// Bytes of one inner chunk's entry in a shard index (offset, nbytes).
pub const SHARD_INDEX_ENTRY_BYTES: u64 = 16;

/// Bytes of the CRC32C that closes a shard index.
const SHARD_INDEX_CRC_BYTES: u64 = 4;

/// An element type, by its Zarr v3 name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    U8,
    I16,
    I32,
    I64,
    U16,
    U32,
    U64,
    F32,
    F64,
}

const DTYPES: [(Dtype, &str, u64); 9] = [
    (Dtype::U8, "uint8", 1),
    (Dtype::I16, "int16", 2),
    (Dtype::I32, "int32", 4),
    (Dtype::I64, "int64", 8),
    (Dtype::U16, "uint16", 2),
    (Dtype::U32, "uint32", 4),
    (Dtype::U64, "uint64", 8),
    (Dtype::F32, "float32", 4),
    (Dtype::F64, "float64", 8),
];

impl Dtype {
    pub fn parse(s: &str) -> Result<Dtype, Error> {
        let t = match s {
            "f8" | "f64" | "double" => "float64",
            "f4" | "f32" | "float" => "float32",
            "i8" | "i64" => "int64",
            "i4" | "i32" => "int32",
            "u1" | "u8" => "uint8",
            other => other,
        };
        DTYPES
            .iter()
            .find(|(_, name, _)| *name == t)
            .map(|(d, _, _)| *d)
            .ok_or_else(|| invalid(format!("{s:?} is not an element type (uint8, int16/32/64, uint16/32/64, float32, float64)")))
    }

    pub fn name(self) -> &'static str {
        DTYPES.iter().find(|(d, _, _)| *d == self).map(|(_, n, _)| *n).unwrap_or("uint8")
    }

    pub fn bytes(self) -> u64 {
        DTYPES.iter().find(|(d, _, _)| *d == self).map(|(_, _, b)| *b).unwrap_or(1)
    }

    fn is_float(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F64)
    }
}

/// An array's disk layout: shape, element type, chunk shape and, when
/// chunks are grouped into shards, the shard shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<u64>,
    dtype: Dtype,
    chunk: Vec<u64>,
    shard: Option<Vec<u64>>,
}

impl Layout {
    pub fn new(shape: Vec<u64>, dtype: Dtype, chunk: Vec<u64>, shard: Option<Vec<u64>>) -> Result<Layout, Error> {
        let n = shape.len();
        if n == 0 || n > DIMS_MAX {
            return Err(limit(format!("an array has 1 to {DIMS_MAX} dimensions, not {n}")));
        }
        if chunk.len() != n || shard.as_ref().is_some_and(|s| s.len() != n) {
            return Err(invalid(format!("the chunk and shard shapes must have {n} dimensions, like the array")));
        }
        if shape.contains(&0) || chunk.contains(&0) {
            return Err(invalid("every extent of the shape and the chunk must be at least 1"));
        }
        if let Some(s) = &shard {
            if s.iter().zip(&chunk).any(|(&s, &c)| s == 0 || s % c != 0) {
                return Err(invalid(format!("the shard shape {s:?} must be a multiple of the chunk shape {chunk:?}")));
            }
        }
        let l = Layout { shape, dtype, chunk, shard };
        let units = l.units_grid().iter().try_fold(1u64, |a, &g| a.checked_mul(g));
        if units.is_none_or(|u| u > UNITS_MAX) {
            return Err(limit(format!("the array would have more than {UNITS_MAX} files; use larger chunks or shards")));
        }
        let bytes = l.chunk.iter().try_fold(dtype.bytes(), |a, &c| a.checked_mul(c));
        if bytes.is_none_or(|b| b > 1 << 40) {
            return Err(limit("a chunk of more than 1 TiB"));
        }
        Ok(l)
    }

    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    pub fn chunk(&self) -> &[u64] {
        &self.chunk
    }

    pub fn shard(&self) -> Option<&[u64]> {
        self.shard.as_deref()
    }

    /// The shape of one file: the shard, else the chunk.
    pub fn unit_shape(&self) -> &[u64] {
        self.shard.as_deref().unwrap_or(&self.chunk)
    }

    /// Files per dimension.
    pub fn units_grid(&self) -> Vec<u64> {
        self.shape.iter().zip(self.unit_shape()).map(|(&n, &u)| n.div_ceil(u)).collect()
    }

    pub fn units(&self) -> u64 {
        self.units_grid().iter().product()
    }

    /// Chunks per dimension over the whole array.
    pub fn chunks_grid(&self) -> Vec<u64> {
        self.shape.iter().zip(&self.chunk).map(|(&n, &c)| n.div_ceil(c)).collect()
    }

    /// Inner chunks per dimension of one shard (all ones without shards).
    pub fn inner_grid(&self) -> Vec<u64> {
        self.unit_shape().iter().zip(&self.chunk).map(|(&u, &c)| u / c).collect()
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk.iter().product::<u64>() * self.dtype.bytes()
    }

    /// Bytes of the shard index (zero without shards).
    pub fn index_bytes(&self) -> u64 {
        match self.shard {
            Some(_) => self.inner_grid().iter().product::<u64>() * SHARD_INDEX_ENTRY_BYTES + SHARD_INDEX_CRC_BYTES,
            None => 0,
        }
    }

    /// Bytes of element data in one file (before the shard index).
    pub fn unit_data_bytes(&self) -> u64 {
        self.inner_grid().iter().product::<u64>() * self.chunk_bytes()
    }

    /// Bytes of one whole file.
    pub fn unit_bytes(&self) -> u64 {
        self.unit_data_bytes() + self.index_bytes()
    }

    /// The file key of unit `u` under the array, Zarr's default encoding
    /// (`c/i/j/k`).
    pub fn key(&self, u: u64) -> String {
        let c = unravel(u, &self.units_grid());
        let mut s = String::from("c");
        for x in c {
            s.push('/');
            s.push_str(&x.to_string());
        }
        s
    }

    /// The file and the byte offset in it where chunk `c` (chunk-grid
    /// coordinates) starts.
    pub fn chunk_base(&self, c: &[u64]) -> (u64, u64) {
        let inner = self.inner_grid();
        let unit: Vec<u64> = c.iter().zip(&inner).map(|(&x, &i)| x / i).collect();
        let within: Vec<u64> = c.iter().zip(&inner).map(|(&x, &i)| x % i).collect();
        (ravel(&unit, &self.units_grid()), ravel(&within, &inner) * self.chunk_bytes())
    }

    /// The file and byte offset of global element `g`.
    /// `chunk_base` of its chunk plus its place in the chunk, in one pass
    /// without allocating: a plan calls it once a piece.
    pub fn locate(&self, g: &[u64]) -> (u64, u64) {
        let unit_shape = self.unit_shape();
        let (mut unit, mut inner, mut within) = (0u64, 0u64, 0u64);
        for (d, &x) in g.iter().enumerate() {
            let (k, per_unit) = (self.chunk[d], unit_shape[d]);
            let (units, inners) = (self.shape[d].div_ceil(per_unit), per_unit / k);
            let c = x / k;
            unit = unit * units + c / inners;
            inner = inner * inners + c % inners;
            within = within * k + x % k;
        }
        (unit, inner * self.chunk_bytes() + within * self.dtype.bytes())
    }

    /// The global element at byte `off` of unit `u`, if that byte is an
    /// element's first byte inside the array (not padding, not the index).
    /// The inverse of [`Layout::locate`], computed independently of it.
    pub fn element_at(&self, u: u64, off: u64) -> Option<Vec<u64>> {
        let b = self.dtype.bytes();
        if !off.is_multiple_of(b) || off >= self.unit_data_bytes() {
            return None;
        }
        let inner = unravel(off / self.chunk_bytes(), &self.inner_grid());
        let within = unravel((off % self.chunk_bytes()) / b, &self.chunk);
        let unit = unravel(u, &self.units_grid());
        let g: Vec<u64> = (0..self.shape.len()).map(|d| unit[d] * self.unit_shape()[d] + inner[d] * self.chunk[d] + within[d]).collect();
        g.iter().zip(&self.shape).all(|(&x, &n)| x < n).then_some(g)
    }

    /// Whether inner chunk `i` of unit `u` holds any element of the array.
    pub fn inner_present(&self, u: u64, i: u64) -> bool {
        let unit = unravel(u, &self.units_grid());
        let inner = unravel(i, &self.inner_grid());
        (0..self.shape.len()).all(|d| unit[d] * self.unit_shape()[d] + inner[d] * self.chunk[d] < self.shape[d])
    }

    /// The shard index of unit `u`, as it ends the file (empty without
    /// shards).
    pub fn shard_index(&self, u: u64) -> Vec<u8> {
        if self.shard.is_none() {
            return Vec::new();
        }
        let n: u64 = self.inner_grid().iter().product();
        let mut v = Vec::with_capacity(self.index_bytes() as usize);
        for i in 0..n {
            let (off, len) = if self.inner_present(u, i) { (i * self.chunk_bytes(), self.chunk_bytes()) } else { (u64::MAX, u64::MAX) };
            v.extend_from_slice(&off.to_le_bytes());
            v.extend_from_slice(&len.to_le_bytes());
        }
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        v
    }

    /// Whether a shard file of unit `u`, `size` bytes long, holds its inner
    /// chunks where this layout reads them: `tail` is the file's last
    /// `shard_index(u).len()` bytes (fewer when it is shorter). The
    /// `zarr.json` cannot tell: zarr-python writes the same metadata but
    /// orders a shard's chunks otherwise (Morton order) and leaves out
    /// chunks that are all fill value, so a read took other chunks' bytes,
    /// or the index's, without an error. Nothing to check without shards.
    pub fn check_shard_index(&self, u: u64, size: u64, tail: &[u8]) -> Result<(), String> {
        let want = self.shard_index(u);
        if want.is_empty() {
            return Ok(());
        }
        if tail.len() != want.len() {
            return Err(format!("{size} bytes, shorter than its shard index; not an array sluice reads"));
        }
        let entries = (want.len() - 4) / 16;
        let Some(i) = (0..entries).find(|i| tail[i * 16..i * 16 + 16] != want[i * 16..i * 16 + 16]) else { return Ok(()) };
        let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let entry = |b: &[u8]| (word(b, i * 16), word(b, i * 16 + 8));
        Err(format!(
            "inner chunk {i} is not where sluice reads it (its index says {:?}, sluice's layout {:?}): the shards were written by another Zarr writer \
             (zarr-python orders a shard's chunks otherwise and leaves out empty ones); sluice reads only its own fixed-offset layout, read this array with zarr-python",
            entry(tail),
            entry(&want)
        ))
    }

    fn bytes_codec(&self) -> Value {
        if self.dtype.bytes() == 1 {
            json!({"name": "bytes"})
        } else {
            json!({"name": "bytes", "configuration": {"endian": "little"}})
        }
    }

    /// The array's `zarr.json`, with `dims` as its dimension names (xarray
    /// needs them) and `attributes` as its user attributes.
    pub fn zarr_json(&self, dims: &[String], attributes: Value) -> Value {
        let codecs = match &self.shard {
            None => json!([self.bytes_codec()]),
            Some(_) => json!([{
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": self.chunk,
                    "codecs": [self.bytes_codec()],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                    "index_location": "end",
                }
            }]),
        };
        let fill = if self.dtype.is_float() { json!(0.0) } else { json!(0) };
        json!({
            "zarr_format": 3,
            "node_type": "array",
            "shape": self.shape,
            "data_type": self.dtype.name(),
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": self.unit_shape()}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": fill,
            "codecs": codecs,
            "attributes": attributes,
            "dimension_names": dims,
        })
    }

    /// The fixed-offset layout of a `zarr.json`, if the array is one
    /// (uncompressed, regular grid, default keys, fill value zero); `Err`
    /// says why not, for arrays another writer made.
    pub fn from_zarr_json(v: &Value) -> Result<Layout, Error> {
        let not = |why: &str| invalid(format!("not a fixed-offset array: {why}"));
        let dims = |v: &Value| -> Option<Vec<u64>> { v.as_array()?.iter().map(|x| x.as_u64()).collect() };
        if v["zarr_format"] != 3 || v["node_type"] != "array" {
            return Err(not("not a Zarr v3 array"));
        }
        let shape = dims(&v["shape"]).ok_or_else(|| not("no shape"))?;
        let dtype = Dtype::parse(v["data_type"].as_str().unwrap_or("")).map_err(|e| not(&e.message))?;
        if v["chunk_grid"]["name"] != "regular" {
            return Err(not("the chunk grid is not regular"));
        }
        let grid = dims(&v["chunk_grid"]["configuration"]["chunk_shape"]).ok_or_else(|| not("no chunk shape"))?;
        let enc = &v["chunk_key_encoding"];
        if enc["name"] != "default" || !(enc["configuration"]["separator"].is_null() || enc["configuration"]["separator"] == "/") {
            return Err(not("chunk keys are not c/i/j"));
        }
        if v["fill_value"].as_f64() != Some(0.0) {
            return Err(not("the fill value is not zero"));
        }
        let codecs = v["codecs"].as_array().ok_or_else(|| not("no codecs"))?;
        let little = |c: &Value| c["name"] == "bytes" && (c["configuration"]["endian"].is_null() || c["configuration"]["endian"] == "little");
        let l = match codecs.as_slice() {
            [c] if little(c) => Layout::new(shape, dtype, grid, None),
            [c] if c["name"] == "sharding_indexed" => {
                let cfg = &c["configuration"];
                let inner = dims(&cfg["chunk_shape"]).ok_or_else(|| not("no inner chunk shape"))?;
                let ok = matches!(cfg["codecs"].as_array().map(|a| a.as_slice()), Some([b]) if little(b))
                    && cfg["index_location"].as_str().unwrap_or("end") == "end"
                    && matches!(cfg["index_codecs"].as_array().map(|a| a.as_slice()), Some([b, c]) if little(b) && c["name"] == "crc32c");
                if !ok {
                    return Err(not("the shards are compressed or their index differs"));
                }
                Layout::new(shape, dtype, inner, Some(grid))
            }
            _ => return Err(not("the chunks are compressed or transformed")),
        };
        l.map_err(|e| not(&e.message))
    }
}
