//! The in-memory store: the pure [`World`] behind a lock. For tests and
//! examples; it keeps nothing across restarts.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use settle_core::{
    Command, Key, Limits, Principal, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp,
    Warning, World,
};

use crate::inspect::Scan;
use settle_portable::Entity;

use crate::store::{BoxFuture, Clock, Snapshot, Store, StoreError, StoreStats, SweepReport};

/// The in-memory [`Store`]: the reference engine (a [`World`]) behind a
/// lock. Replies are "durable" for as long as the process lives.
pub struct MemStore {
    world: Mutex<World>,
    clock: Clock,
    /// The latest time used: the store's clock never goes backwards (a
    /// wall clock stepped back would otherwise make every record settled
    /// since look as if it came from the future, SPEC §6.9).
    last_now: AtomicU64,
}

impl MemStore {
    /// An empty store with `limits`, reading time from `clock`.
    pub fn new(limits: Limits, clock: Clock) -> MemStore {
        MemStore {
            world: Mutex::new(World::new(limits)),
            clock,
            last_now: AtomicU64::new(0),
        }
    }

    /// The store's clock: the configured clock, never earlier than a time already used.
    fn now(&self) -> Timestamp {
        let t = self.clock.now().0;
        Timestamp(self.last_now.fetch_max(t, Ordering::SeqCst).max(t))
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
            // The clock is read under the lock, so commands apply in the
            // order of their times (read before it, a later command could
            // apply first and make an earlier one see the future).
            let mut w = self.world.lock();
            let now = self.now();
            Ok(w.execute(tenant, &cmd, now).reply)
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        Box::pin(async move {
            let w = self.world.lock();
            let now = self.now();
            Ok(w.get(tenant, key, now))
        })
    }

    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        Box::pin(async move { Ok(Ok(self.world.lock().generation(tenant, principal))) })
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
            let mut w = self.world.lock();
            let now = self.now();
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
            let w = self.world.lock();
            let now = self.now();
            let mut s = StoreStats::default();
            for r in w.records.values() {
                if r.is_from_the_future(now) || settle_core::invariants::check_record(r).is_err() {
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
        Box::pin(async move { Ok(MemStore::now(self)) })
    }

    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        Box::pin(async move {
            let w = self.world.lock();
            let now = self.clock.now();
            // A test store: sorting the tenant's keys per call is fine here.
            let mut keys: Vec<&Key> = w
                .records
                .keys()
                .filter(|(t, k)| t == tenant && after.is_none_or(|a| k > a))
                .map(|(_, k)| k)
                .collect();
            keys.sort_unstable();
            let more = keys.len() > max;
            keys.truncate(max);
            let records: Vec<Record> = keys
                .iter()
                .filter_map(|k| match w.get(tenant, k, now) {
                    Ok(r) => r,
                    // Refused (from the future): listed as stored.
                    Err(_) => w.records.get(&(tenant.clone(), (*k).clone())).cloned(),
                })
                .collect();
            let next = if more {
                keys.last().map(|k| (*k).clone())
            } else {
                None
            };
            Ok(Scan { records, next, now })
        })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn export(&self) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            // One lock: the copy is the snapshot.
            let w = self.world.lock();
            let mut entities = Vec::with_capacity(w.records.len());
            for ((tenant, _), record) in &w.records {
                entities.push(Entity::Record {
                    tenant: tenant.clone(),
                    record: record.clone(),
                });
            }
            for ((tenant, principal), state) in &w.principals {
                entities.push(Entity::Principal {
                    tenant: tenant.clone(),
                    principal: principal.clone(),
                    state: *state,
                });
            }
            for ((tenant, task), warnings) in &w.warnings {
                entities.push(Entity::Warnings {
                    tenant: tenant.clone(),
                    task: task.clone(),
                    warnings: warnings.clone(),
                });
            }
            let floor = w.next_fence;
            drop(w);
            Ok(Snapshot::of("memory", floor, entities))
        })
    }

    fn fence_floor(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { Ok(self.world.lock().next_fence) })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, OnceLock, Weak};

    use settle_core::testkit::*;
    use settle_core::{ClaimDecision, Limits, Reply};

    use super::*;

    /// SPEC §4: times come from the store's clock, and a command's time must
    /// be read while it holds the store, or two calls can apply out of time
    /// order (a later call applies first; the earlier one then sees a
    /// receipt from its future and refuses a healthy record). The clock
    /// here counts every read made while the store's lock is free.
    #[test]
    fn the_clock_is_read_under_the_store_lock() {
        let store_slot: Arc<OnceLock<Weak<MemStore>>> = Arc::new(OnceLock::new());
        let unlocked_reads = Arc::new(AtomicUsize::new(0));
        let reads = Arc::new(AtomicUsize::new(0));
        let clock = {
            let (slot, unlocked, reads) =
                (store_slot.clone(), unlocked_reads.clone(), reads.clone());
            Clock::with_source(move || {
                reads.fetch_add(1, Ordering::SeqCst);
                if let Some(s) = slot.get().and_then(Weak::upgrade)
                    && !s.world.is_locked()
                {
                    unlocked.fetch_add(1, Ordering::SeqCst);
                }
                Timestamp::from_system_time(std::time::SystemTime::now())
            })
        };
        let store = Arc::new(MemStore::new(Limits::default(), clock));
        store_slot.set(Arc::downgrade(&store)).unwrap();
        let t = TenantId::default_tenant();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let Reply::Claim(ClaimDecision::Execute(g)) = store
                .execute(&t, claim("k", 1, binding("alice", 0)))
                .await
                .unwrap()
            else {
                panic!()
            };
            store
                .execute(
                    &t,
                    settle("k", g.fence, 1, binding("alice", 0), completed(1)),
                )
                .await
                .unwrap();
            store.get(&t, &key("k")).await.unwrap().unwrap();
            store.sweep().await.unwrap();
            store.stats(1000).await.unwrap();
        });
        assert!(reads.load(Ordering::SeqCst) >= 5);
        assert_eq!(unlocked_reads.load(Ordering::SeqCst), 0);
    }

    /// The store's clock never goes backwards: a wall clock stepped back
    /// (NTP, a VM restored) must not make a just-settled record look as
    /// if it came from the future (found by settle-sim: `get` and every
    /// claim answered `record_refused` after a 10 s step back).
    #[test]
    fn a_clock_stepped_back_is_absorbed() {
        let clock = Clock::system();
        let store = MemStore::new(Limits::default(), clock.clone());
        let t = TenantId::default_tenant();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let Reply::Claim(ClaimDecision::Execute(g)) = store
                .execute(&t, claim("k", 1, binding("alice", 0)))
                .await
                .unwrap()
            else {
                panic!()
            };
            let settled = store
                .execute(
                    &t,
                    settle("k", g.fence, 1, binding("alice", 0), completed(1)),
                )
                .await
                .unwrap();
            clock.advance(-10_000);
            let r = store.get(&t, &key("k")).await.unwrap();
            assert!(matches!(r, Ok(Some(_))), "{r:?}");
            let again = store
                .execute(&t, claim("k", 1, binding("alice", 0)))
                .await
                .unwrap();
            let Reply::Claim(ClaimDecision::Replay { receipt, .. }) = again else {
                panic!("{again:?}")
            };
            assert_eq!(Reply::Receipt(receipt), settled);
        });
    }
}
