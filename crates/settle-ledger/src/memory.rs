//! The in-memory store: the pure [`World`] behind a lock. For tests and
//! examples; it keeps nothing across restarts.

use parking_lot::Mutex;
use settle_core::{
    Command, Key, Limits, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning, World,
};

use crate::store::{BoxFuture, Clock, Store, StoreError, StoreStats, SweepReport};

pub struct MemStore {
    world: Mutex<World>,
    clock: Clock,
}

impl MemStore {
    pub fn new(limits: Limits, clock: Clock) -> MemStore {
        MemStore {
            world: Mutex::new(World::new(limits)),
            clock,
        }
    }
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore::new(Limits::default(), Clock::system())
    }
}

impl Store for MemStore {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(async move {
            let now = self.clock.now();
            Ok(self.world.lock().execute(tenant, &cmd, now).reply)
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        Box::pin(async move { Ok(self.world.lock().get(tenant, key, self.clock.now())) })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        Box::pin(async move { Ok(self.world.lock().warnings(tenant, task)) })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move {
            let now = self.clock.now();
            let mut w = self.world.lock();
            let ids: Vec<(TenantId, Key, bool)> = w
                .records
                .iter()
                .map(|((t, k), r)| (t.clone(), k.clone(), r.status.is_terminal()))
                .collect();
            let mut report = SweepReport::default();
            for (t, key, terminal) in ids {
                let cmd = if terminal {
                    Command::Collect { key }
                } else {
                    Command::Expire { key }
                };
                match w.execute(&t, &cmd, now).reply {
                    Reply::Expired { ended: true } => report.expired += 1,
                    Reply::Collected { removed: true } => report.collected += 1,
                    _ => {}
                }
            }
            Ok(report)
        })
    }

    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(async move {
            let now = self.clock.now();
            let w = self.world.lock();
            let mut s = StoreStats::default();
            for r in w.records.values() {
                if r.is_from_the_future(now) {
                    s.refused += 1;
                }
                if r.disputed {
                    s.disputed += 1;
                }
                s.count(r, now, stuck_after_ms);
            }
            Ok(s)
        })
    }

    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        Box::pin(async move { Ok(self.clock.now()) })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
}
