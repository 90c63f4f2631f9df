//! Helpers shared by the tests that hold checkpoints at a gate.

use std::sync::Arc;

use settle_core::TenantId;
use settle_embedded::Faults;

pub fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// Log segments on disk.
pub fn logs(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count()
}

/// Lets held checkpoints go when dropped (also when a test panics), so
/// the store's threads can finish.
pub struct Release(pub Arc<Faults>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.release_checkpoints();
    }
}
