//! The etcd back end of the metadata store: etcd's v3 key-value API
//! through its JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`), over
//! plain HTTP/1.1, one connection per call.
//!
//! A transaction (`Etcd::transact`) is optimistic, as etcd's own STM:
//! every read is made at the revision of the transaction's first read,
//! and remembers each key's modification revision (0: absent); the writes
//! are buffered, and the commit is one etcd `Txn` whose comparisons say
//! that nothing read has changed since (and no key appeared in a range
//! scanned). When another writer got there first, the whole closure runs
//! again on fresh reads, at most `RETRIES_MAX` times.
//!
//! Endpoints are tried in turn: a member that refuses, times out or
//! answers that it has no leader is passed over for the next, so a
//! cluster that keeps a quorum keeps answering.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};
use sluice_remote::{Error, ErrorKind, Result};

use crate::kv::Tx;

/// Most times one transaction is run again after a conflict.
const RETRIES_MAX: u32 = 64;
/// Keys asked for per range page of a scan.
const PAGE_KEYS: u64 = 512;
/// Patience with one endpoint for one call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest reply read from etcd.
const REPLY_BYTES_MAX: usize = 64 << 20;
/// Rounds over all endpoints before a call fails (an election takes a
/// second or two).
const ROUNDS_MAX: u32 = 20;

/// A connection to an etcd cluster, under one key prefix.
pub struct Etcd {
    endpoints: Vec<String>,
    /// The endpoint that answered last.
    at: AtomicUsize,
    /// Entry keys are `PREFIX/e/PATH`, counters `PREFIX/c/NAME`.
    prefix: String,
}

fn etcd_err(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Store, libc::EIO, format!("etcd: {}", msg.into()))
}

/// The first key after every key that starts with `k` (etcd's range end
/// for a prefix): `k` with its last byte below 0xff incremented.
fn prefix_end(k: &[u8]) -> Vec<u8> {
    let mut end = k.to_vec();
    while let Some(&last) = end.last() {
        if last < 0xff {
            *end.last_mut().expect("not empty") += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

fn b64(k: &[u8]) -> String {
    B64.encode(k)
}

fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// One key-value pair of a range reply.
struct Kv {
    key: Vec<u8>,
    value: Vec<u8>,
    mod_revision: i64,
}

fn kvs(reply: &Value) -> Result<Vec<Kv>> {
    let mut out = Vec::new();
    for kv in reply["kvs"].as_array().map_or(&[][..], Vec::as_slice) {
        let key = B64.decode(kv["key"].as_str().unwrap_or_default()).map_err(|e| etcd_err(format!("bad key in a reply: {e}")))?;
        let value = B64.decode(kv["value"].as_str().unwrap_or_default()).map_err(|e| etcd_err(format!("bad value in a reply: {e}")))?;
        out.push(Kv { key, value, mod_revision: int(&kv["mod_revision"]) });
    }
    Ok(out)
}

/// The body of an HTTP/1.1 response (`Content-Length` or chunked).
fn http_body(raw: &[u8]) -> Result<(u32, Vec<u8>)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| etcd_err("a reply without headers"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status: u32 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| etcd_err("a reply without a status"))?;
    let mut body = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, body.to_vec()));
    }
    let mut out = Vec::new();
    loop {
        let line_end = body.windows(2).position(|w| w == b"\r\n").ok_or_else(|| etcd_err("a chunk without its size"))?;
        let size = usize::from_str_radix(String::from_utf8_lossy(&body[..line_end]).trim(), 16).map_err(|_| etcd_err("a bad chunk size"))?;
        body = &body[line_end + 2..];
        if size == 0 || body.len() < size {
            return Ok((status, out));
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

impl Etcd {
    /// etcd's default `--max-txn-ops`: operations in one transaction.
    pub const TXN_OPS_MAX: usize = 128;

    /// `etcd://h1:2379,h2:2379` (or without the scheme), keys under `prefix`.
    pub fn new(endpoints: &str, prefix: &str) -> Result<Etcd> {
        let list = endpoints.strip_prefix("etcd://").unwrap_or(endpoints);
        let endpoints: Vec<String> = list.split(',').map(str::trim).filter(|e| !e.is_empty()).map(String::from).collect();
        if endpoints.is_empty() {
            return Err(Error::invalid("no etcd endpoint given (etcd://HOST:PORT,...)"));
        }
        if prefix.is_empty() || prefix.contains('\0') {
            return Err(Error::invalid("the etcd key prefix must be a non-empty name"));
        }
        Ok(Etcd { endpoints, at: AtomicUsize::new(0), prefix: prefix.trim_end_matches('/').to_string() })
    }

    fn entry_key(&self, path: &str) -> Vec<u8> {
        format!("{}/e/{path}", self.prefix).into_bytes()
    }

    fn config_key(&self, name: &str) -> Vec<u8> {
        format!("{}/c/{name}", self.prefix).into_bytes()
    }

    /// One POST to one endpoint: the JSON reply, or why not.
    fn post_to(endpoint: &str, path: &str, body: &Value) -> std::result::Result<Value, String> {
        let addr = endpoint.to_socket_addrs().map_err(|e| format!("{endpoint}: {e}"))?.next().ok_or_else(|| format!("{endpoint}: no address"))?;
        let mut s = TcpStream::connect_timeout(&addr, CALL_TIMEOUT).map_err(|e| format!("{endpoint}: {e}"))?;
        let _ = s.set_read_timeout(Some(CALL_TIMEOUT));
        let _ = s.set_write_timeout(Some(CALL_TIMEOUT));
        let _ = s.set_nodelay(true);
        let body = body.to_string();
        let req = format!("POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        s.write_all(req.as_bytes()).map_err(|e| format!("{endpoint}: {e}"))?;
        let mut raw = Vec::new();
        s.take(REPLY_BYTES_MAX as u64 + 1).read_to_end(&mut raw).map_err(|e| format!("{endpoint}: {e}"))?;
        if raw.len() > REPLY_BYTES_MAX {
            return Err(format!("{endpoint}: a reply over {REPLY_BYTES_MAX} bytes"));
        }
        let (status, body) = http_body(&raw).map_err(|e| format!("{endpoint}: {}", e.message))?;
        let v: Value = serde_json::from_slice(&body).map_err(|e| format!("{endpoint}: HTTP {status}, not JSON: {e}"))?;
        if status != 200 {
            return Err(format!("{endpoint}: HTTP {status}: {}", v["error"].as_str().or(v["message"].as_str()).unwrap_or("?")));
        }
        Ok(v)
    }

    /// POST to the endpoint that answered last, else the next ones, for
    /// up to `ROUNDS_MAX` rounds.
    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let n = self.endpoints.len();
        let mut last = String::new();
        for round in 0..ROUNDS_MAX {
            let start = self.at.load(Ordering::Relaxed);
            for i in 0..n {
                let k = (start + i) % n;
                match Etcd::post_to(&self.endpoints[k], path, body) {
                    Ok(v) => {
                        self.at.store(k, Ordering::Relaxed);
                        return Ok(v);
                    }
                    Err(why) => last = why,
                }
            }
            std::thread::sleep(Duration::from_millis(100 * u64::from(round + 1).min(5)));
        }
        Err(etcd_err(format!("no endpoint of {} answered: {last}", self.endpoints.join(","))))
    }

    fn range(&self, key: &[u8], end: Option<&[u8]>, revision: i64, limit: u64) -> Result<(i64, Vec<Kv>, bool)> {
        let mut body = json!({ "key": b64(key) });
        if let Some(e) = end {
            body["range_end"] = json!(b64(e));
        }
        if revision > 0 {
            body["revision"] = json!(revision.to_string());
        }
        if limit > 0 {
            body["limit"] = json!(limit.to_string());
        }
        let v = self.post("/v3/kv/range", &body)?;
        Ok((int(&v["header"]["revision"]), kvs(&v)?, v["more"].as_bool().unwrap_or(false)))
    }

    /// Run `f` as one transaction (see the module documentation).
    pub(crate) fn transact<T>(&self, f: &mut dyn FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        for _ in 0..RETRIES_MAX {
            let mut tx = EtcdTx { etcd: self, revision: 0, reads: BTreeMap::new(), scans: Vec::new(), writes: BTreeMap::new() };
            let out = f(&mut tx)?;
            if tx.commit()? {
                return Ok(out);
            }
        }
        Err(Error::new(ErrorKind::Store, libc::EAGAIN, format!("etcd: a metadata change conflicted with others {RETRIES_MAX} times")))
    }
}

/// One optimistic transaction.
struct EtcdTx<'a> {
    etcd: &'a Etcd,
    /// The revision every read is made at (0 until the first read).
    revision: i64,
    /// Keys read, with their modification revision (0: absent).
    reads: BTreeMap<Vec<u8>, i64>,
    /// Key ranges scanned, `[start, end)`.
    scans: Vec<(Vec<u8>, Vec<u8>)>,
    /// Buffered writes (None: delete).
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl EtcdTx<'_> {
    fn read(&mut self, key: Vec<u8>) -> Result<Option<Vec<u8>>> {
        if let Some(w) = self.writes.get(&key) {
            return Ok(w.clone());
        }
        let (rev, got, _) = self.etcd.range(&key, None, self.revision, 0)?;
        if self.revision == 0 {
            self.revision = rev;
        }
        let got = got.into_iter().next();
        self.reads.insert(key, got.as_ref().map_or(0, |kv| kv.mod_revision));
        Ok(got.map(|kv| kv.value))
    }

    /// Apply the writes if nothing read changed; false on a conflict.
    fn commit(self) -> Result<bool> {
        if self.writes.is_empty() {
            return Ok(true);
        }
        let mut compare: Vec<Value> = self
            .reads
            .iter()
            .map(|(k, &m)| match m {
                0 => json!({ "key": b64(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0" }),
                m => json!({ "key": b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": m.to_string() }),
            })
            .collect();
        // No key in a scanned range was changed or made after the reads.
        for (start, end) in &self.scans {
            compare.push(json!({ "key": b64(start), "range_end": b64(end), "target": "MOD", "result": "LESS", "mod_revision": (self.revision + 1).to_string() }));
        }
        if self.writes.len() > Etcd::TXN_OPS_MAX {
            return Err(Error::new(
                ErrorKind::Limit,
                libc::EOVERFLOW,
                format!("etcd: one metadata change of {} keys, past {} (etcd's --max-txn-ops)", self.writes.len(), Etcd::TXN_OPS_MAX),
            ));
        }
        let success: Vec<Value> = self
            .writes
            .iter()
            .map(|(k, v)| match v {
                Some(v) => json!({ "request_put": { "key": b64(k), "value": b64(v) } }),
                None => json!({ "request_delete_range": { "key": b64(k) } }),
            })
            .collect();
        let v = self.etcd.post("/v3/kv/txn", &json!({ "compare": compare, "success": success }))?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }
}

impl Tx for EtcdTx<'_> {
    fn get(&mut self, path: &str) -> Result<Option<Vec<u8>>> {
        let key = self.etcd.entry_key(path);
        self.read(key)
    }

    fn scan(&mut self, prefix: &str, visit: &mut dyn FnMut(&str, &[u8]) -> Result<bool>) -> Result<()> {
        let start = self.etcd.entry_key(prefix);
        let end = prefix_end(&start);
        let strip = self.etcd.entry_key("").len();
        // The transaction's own writes in the range, merged in key order.
        let mut mine: BTreeMap<Vec<u8>, Option<Vec<u8>>> = self.writes.range(start.clone()..end.clone()).map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut from = start.clone();
        self.scans.push((start, end.clone()));
        loop {
            let (rev, page, more) = self.etcd.range(&from, Some(&end), self.revision, PAGE_KEYS)?;
            if self.revision == 0 {
                self.revision = rev;
            }
            let last = page.last().map(|kv| kv.key.clone());
            let mut items: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for kv in page {
                // Writes of this transaction before this key come first.
                let earlier: Vec<Vec<u8>> = mine.range(..kv.key.clone()).map(|(k, _)| k.clone()).collect();
                for k in earlier {
                    if let Some(Some(v)) = mine.remove(&k) {
                        items.push((k, v));
                    }
                }
                match mine.remove(&kv.key) {
                    Some(Some(v)) => items.push((kv.key, v)),
                    Some(None) => {}
                    None => items.push((kv.key, kv.value)),
                }
            }
            if !more {
                items.extend(std::mem::take(&mut mine).into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
            }
            for (k, v) in items {
                let path = String::from_utf8_lossy(&k[strip..]).into_owned();
                if !visit(&path, &v)? {
                    return Ok(());
                }
            }
            match (more, last) {
                (true, Some(mut l)) => {
                    l.push(0);
                    from = l;
                }
                _ => return Ok(()),
            }
        }
    }

    fn put(&mut self, path: &str, value: &[u8]) -> Result<()> {
        self.writes.insert(self.etcd.entry_key(path), Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, path: &str) -> Result<()> {
        self.writes.insert(self.etcd.entry_key(path), None);
        Ok(())
    }

    fn config(&mut self, name: &str) -> Result<Option<u64>> {
        let key = self.etcd.config_key(name);
        Ok(self.read(key)?.and_then(|v| String::from_utf8_lossy(&v).parse().ok()))
    }

    fn set_config(&mut self, name: &str, value: u64) -> Result<()> {
        self.writes.insert(self.etcd.config_key(name), Some(value.to_string().into_bytes()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_past_every_key_that_starts_with_it() {
        assert_eq!(prefix_end(b"a/e/"), b"a/e0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn replies_are_read_whole_or_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(http_body(plain).unwrap(), (200, b"{}".to_vec()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(http_body(chunked).unwrap(), (200, b"{\"a\":1}".to_vec()));
        assert!(http_body(b"garbage").is_err());
    }

    /// A fake etcd that answers one request (whose body is `{}`) with a
    /// JSON reply of exactly `bytes` bytes, headers included.
    fn fake_etcd(bytes: usize) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            // The request, to its body `{}`: unread bytes at close would
            // reset the connection under the reply.
            while !head.ends_with(b"\r\n\r\n{}") && s.read(&mut b).unwrap_or(0) == 1 {
                head.push(b[0]);
            }
            let text = |body_len: usize| format!("HTTP/1.1 200 OK\r\nContent-Length: {body_len:010}\r\n\r\n");
            let body_len = bytes - text(0).len();
            let body = format!("{{\"x\":\"{}\"}}", "a".repeat(body_len - 8));
            let _ = s.write_all(text(body_len).as_bytes());
            let _ = s.write_all(body.as_bytes());
        });
        addr
    }

    #[test]
    fn a_reply_of_reply_bytes_max_is_read_and_one_more_refused() {
        let v = Etcd::post_to(&fake_etcd(REPLY_BYTES_MAX), "/v3/kv/range", &serde_json::json!({})).unwrap();
        // 47 bytes of status line and headers, 8 of `{"x":""}`.
        assert_eq!(v["x"].as_str().map(str::len), Some(REPLY_BYTES_MAX - 47 - 8));
        let e = Etcd::post_to(&fake_etcd(REPLY_BYTES_MAX + 1), "/v3/kv/range", &serde_json::json!({})).unwrap_err();
        assert!(e.contains("a reply over"), "{e}");
    }

    #[test]
    fn endpoints_and_prefix_are_checked() {
        assert!(Etcd::new("etcd://", "p").is_err());
        assert!(Etcd::new("h:2379", "").is_err());
        let e = Etcd::new("etcd://a:1, b:2,", "cl/").unwrap();
        assert_eq!(e.endpoints, ["a:1", "b:2"]);
        assert_eq!(e.entry_key("x/y"), b"cl/e/x/y");
    }
}
