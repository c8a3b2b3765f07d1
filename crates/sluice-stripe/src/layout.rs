//! `Layout` (resolved: every field concrete) and `LayoutRequest` (what
//! `setstripe` asks for: 0 = inherit, -1 = all servers / any start).

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// Stripe sizes are multiples of this, in bytes (SFIO used units this
/// small; Lustre requires 64 KiB, which we do not).
pub const STRIPE_UNIT_BYTES: u64 = 512;
/// Largest stripe size, in bytes: Lustre's 4 GiB limit.
pub const STRIPE_BYTES_MAX: u64 = 4 << 30;
/// Stripe size of the root directory's default layout, in bytes (Lustre's
/// default).
pub const STRIPE_BYTES_DEFAULT: u64 = 1 << 20;
/// Most data servers a cluster may have (and so most objects per file).
pub const SERVERS_MAX: u32 = 1024;
/// `count` in a request meaning "every data server" (`lfs setstripe -c -1`).
pub const COUNT_ALL: i32 = -1;

/// A resolved RAID-0 layout. Object `k` (0-based) holds stripes
/// `k, k + count, k + 2 count, …` and lives on server `(start + k) % servers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Bytes per stripe, a multiple of `STRIPE_UNIT_BYTES`.
    pub stripe_bytes: u64,
    /// Objects, 1..=`servers`.
    pub count: u32,
    /// Server of object 0, 0..`servers`.
    pub start: u32,
    /// Data servers in the cluster when the layout was made.
    pub servers: u32,
}

impl Layout {
    /// A checked layout.
    pub fn new(stripe_bytes: u64, count: u32, start: u32, servers: u32) -> Result<Layout> {
        check_stripe_bytes(stripe_bytes)?;
        if servers == 0 || servers > SERVERS_MAX {
            return Err(Error::new(ErrorKind::BadLayout, format!("{servers} data servers: expected 1..={SERVERS_MAX}")));
        }
        if count == 0 || count > servers {
            return Err(Error::new(ErrorKind::BadLayout, format!("stripe count {count}: expected 1..={servers} (the data servers)")));
        }
        if start >= servers {
            return Err(Error::new(ErrorKind::BadLayout, format!("stripe offset {start}: expected 0..{servers}")));
        }
        Ok(Layout { stripe_bytes, count, start, servers })
    }

    /// The data server holding object `object`.
    pub fn server_of(&self, object: u32) -> u32 {
        ((self.start as u64 + object as u64) % self.servers as u64) as u32
    }
}

fn check_stripe_bytes(stripe_bytes: u64) -> Result<()> {
    if stripe_bytes == 0 || !stripe_bytes.is_multiple_of(STRIPE_UNIT_BYTES) || stripe_bytes > STRIPE_BYTES_MAX {
        return Err(Error::new(ErrorKind::BadLayout, format!("stripe size {stripe_bytes}: expected a multiple of {STRIPE_UNIT_BYTES} B up to {STRIPE_BYTES_MAX} B")));
    }
    Ok(())
}

/// What `setstripe` asks for; unset fields come from the parent's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRequest {
    /// 0: inherit.
    pub stripe_bytes: u64,
    /// 0: inherit; `COUNT_ALL` (-1): every server; else 1..=servers.
    pub count: i32,
    /// -1: any (chosen per file to spread objects); else the first server.
    pub start: i32,
}

impl LayoutRequest {
    /// The root directory's default: 1 MiB stripes, one object, any start.
    pub const ROOT_DEFAULT: LayoutRequest = LayoutRequest { stripe_bytes: STRIPE_BYTES_DEFAULT, count: 1, start: -1 };

    /// Check the fields that do not depend on the cluster.
    pub fn check(&self) -> Result<()> {
        if self.stripe_bytes != 0 {
            check_stripe_bytes(self.stripe_bytes)?;
        }
        if self.count < COUNT_ALL || self.count > SERVERS_MAX as i32 {
            return Err(Error::new(ErrorKind::BadLayout, format!("stripe count {}: expected -1, 0 or 1..={SERVERS_MAX}", self.count)));
        }
        if self.start < -1 || self.start >= SERVERS_MAX as i32 {
            return Err(Error::new(ErrorKind::BadLayout, format!("stripe offset {}: expected -1 or 0..{SERVERS_MAX}", self.start)));
        }
        Ok(())
    }

    /// Fill the unset fields of `self` from `parent`.
    pub fn inherit(&self, parent: &LayoutRequest) -> LayoutRequest {
        LayoutRequest {
            stripe_bytes: if self.stripe_bytes == 0 { parent.stripe_bytes } else { self.stripe_bytes },
            count: if self.count == 0 { parent.count } else { self.count },
            start: if self.start == -1 { parent.start } else { self.start },
        }
    }

    /// The concrete layout on `servers` data servers; `spread` picks the
    /// start when none is set (the file id, so files rotate over servers).
    pub fn resolve(&self, servers: u32, spread: u64) -> Result<Layout> {
        self.check()?;
        let full = self.inherit(&LayoutRequest::ROOT_DEFAULT);
        let count = if full.count == COUNT_ALL { servers } else { full.count as u32 };
        let start = if full.start < 0 { (spread % servers.max(1) as u64) as u32 } else { full.start as u32 };
        Layout::new(full.stripe_bytes, count, start, servers)
    }
}
