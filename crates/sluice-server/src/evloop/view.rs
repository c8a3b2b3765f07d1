//! The metrics view: what a scrape sees of the scheduler, built between
//! two turns when one asks (`view::ViewSlot`), and the bytes clients
//! wrote themselves under write leases, added to their applications'
//! counters before a scrape or a `Stats` reads them.

use super::EventLoop;
use crate::conn::Conn;
use crate::shared::Shared;
use crate::sync::lock;

/// Add what connection `c`'s client reports it wrote itself under write
/// leases since the last look (the doorbell's `leased_bytes`,
/// `sluice_proto::post`) to its application's bytes written. A count that
/// went down (a client writing its own word) adds nothing until it
/// passes what was seen.
pub(super) fn fold_leased(shared: &Shared, c: &mut Conn) {
    let (Some(shm), Some(app)) = (c.shm.as_ref(), c.app) else { return };
    let now = shm.leased_bytes();
    if now > c.leased_seen {
        lock(&shared.apps).record_leased_write(app, now - c.leased_seen);
        c.leased_seen = now;
    }
}

impl EventLoop {
    /// `fold_leased` for every connection in the table.
    pub(super) fn fold_leased_all(&mut self) {
        for c in self.conns.values_mut() {
            fold_leased(&self.shared, c);
        }
    }

    /// Publish the view a scrape waits for (one atomic load per turn when
    /// none does).
    pub(super) fn publish_view(&mut self) {
        if self.shared.view.wanted() {
            // The scrape reads the applications' counters next.
            self.fold_leased_all();
            self.shared.view.publish(self.disp.view());
        }
    }
}
