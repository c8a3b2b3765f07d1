//! The metrics view: what a scrape sees of the scheduler, built between
//! two turns when one asks (`view::ViewSlot`), and the bytes clients
//! wrote themselves under write leases, added to their applications'
//! counters before a scrape or a `Stats` reads them.

use super::EventLoop;

impl EventLoop {
    /// `fold_leased` for every connection in the table.
    pub(super) fn fold_leased_all(&mut self) {
        for c in self.conns.values_mut() {
            c.fold_leased(&self.shared.apps);
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
