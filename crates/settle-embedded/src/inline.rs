//! The inline store, [`InlineStore`]: the same engine with no threads,
//! driven on the caller's thread (deterministic).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use settle_core::{Command, Key, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning};
use settle_ledger::inspect::Scan;
use settle_ledger::{BoxFuture, Snapshot, Store, StoreError, StoreStats, SweepReport};

use crate::codec::{EntityKey, Value, decode_value};
use crate::fs::{Fs, create_dir_all_durable};
use crate::index::Index;
use crate::open::{io, recover_engine};
use crate::options::EmbeddedOptions;
use crate::portable::Frozen;
use crate::reads::{get_sync, health_sync, scan_sync, stats_sync, sweep_candidates, warnings_sync};
use crate::{Checkpointer, Core, SealSink, Shared};

/// The same engine with no threads: each call applies and commits its
/// commands, then runs any checkpoint due, on the caller's thread. Batches
/// are exactly the calls, so a run is a deterministic function of its
/// inputs, its clock and its disk: this is what the power-loss tests and
/// the deterministic simulator (`settle-sim`) drive on a simulated disk.
pub struct InlineStore<F: Fs, I: Index> {
    inner: Mutex<Inline<F, I>>,
    shared: Arc<Shared<I>>,
    _lock: F::Lock,
}

struct Inline<F: Fs, I: Index> {
    core: Core<F, I>,
    ckpt: Checkpointer<F, I>,
    closed: bool,
}

impl<F: Fs, I: Index> Inline<F, I> {
    fn checkpoint_sealed(&mut self) {
        let SealSink::Queue(q) = &mut self.core.log.sealed else {
            return;
        };
        let Some(&seq) = q.last() else { return };
        q.clear();
        if self.core.shared.is_poisoned() {
            return;
        }
        if let Err(e) = self.ckpt.run_to(seq) {
            tracing::error!(error = %e, "checkpoint failed; failing closed");
            self.core.shared.poison();
        }
    }
}

impl<F: Fs, I: Index> InlineStore<F, I> {
    /// Opens (creating if needed) the store in `dir` on `fs` with `index`.
    pub fn open(
        fs: &F,
        dir: impl AsRef<Path>,
        index: I,
        opts: EmbeddedOptions,
    ) -> Result<InlineStore<F, I>, StoreError> {
        let dir = dir.as_ref();
        create_dir_all_durable(fs, &dir.join("wal")).map_err(io)?;
        let lock = fs.lock(&dir.join("LOCK")).map_err(io)?;
        let (core, ckpt) = recover_engine(fs, dir, index, &opts, SealSink::Queue(Vec::new()))?;
        Ok(InlineStore {
            shared: core.shared.clone(),
            inner: Mutex::new(Inline {
                core,
                ckpt,
                closed: false,
            }),
            _lock: lock,
        })
    }

    /// Applies the commands as one group commit; each answer arrives only
    /// after the batch is durable.
    pub fn execute_batch(&self, cmds: Vec<(TenantId, Command)>) -> Vec<Result<Reply, StoreError>> {
        let mut g = self.inner.lock();
        let mut out: Vec<Result<Reply, StoreError>> =
            (0..cmds.len()).map(|_| Err(StoreError::Closed)).collect();
        if g.closed {
            return out;
        }
        let mut batch: Vec<(TenantId, Command, usize)> = cmds
            .into_iter()
            .enumerate()
            .map(|(i, (t, c))| (t, c, i))
            .collect();
        g.core.commit(&mut batch, |i, r| out[i] = r);
        g.checkpoint_sealed();
        out
    }

    /// One command, one group commit.
    pub fn execute_now(&self, tenant: &TenantId, cmd: Command) -> Result<Reply, StoreError> {
        self.execute_batch(vec![(tenant.clone(), cmd)])
            .pop()
            .expect("one answer")
    }

    /// The `get` view now, on the caller's thread (see [`Store::get`]).
    pub fn get_now(
        &self,
        tenant: &TenantId,
        key: &Key,
    ) -> Result<Result<Option<Record>, RefusalCode>, StoreError> {
        get_sync(&self.shared, tenant, key)
    }

    /// The warnings of `task`, on the caller's thread.
    pub fn warnings_now(
        &self,
        tenant: &TenantId,
        task: &TaskId,
    ) -> Result<Vec<Warning>, StoreError> {
        warnings_sync(&self.shared, tenant, task)
    }

    /// Seals the current segment and checkpoints everything sealed
    /// (as a clean close does), keeping the store open.
    pub fn checkpoint_now(&self) -> Result<(), StoreError> {
        let mut g = self.inner.lock();
        if g.core.log.wal.bytes() > 0 {
            g.core.seal()?;
        }
        g.checkpoint_sealed();
        if self.shared.is_poisoned() {
            return Err(StoreError::Poisoned);
        }
        Ok(())
    }

    /// Checkpoints and stops accepting commands (a clean shutdown).
    pub fn close(&self) {
        let poisoned = self.shared.is_poisoned();
        if !poisoned {
            let _ = self.checkpoint_now();
        }
        self.inner.lock().closed = true;
    }

    /// Whether the store refuses writes after a storage failure.
    pub fn is_poisoned(&self) -> bool {
        self.shared.is_poisoned()
    }

    /// Entities held in memory (open records plus what awaits a checkpoint).
    pub fn resident(&self) -> usize {
        self.shared.resident()
    }

    /// Stats as [`Store::stats`] reports them.
    pub fn stats_now(&self, stuck_after_ms: u64) -> StoreStats {
        stats_sync(&self.shared, stuck_after_ms)
    }

    /// Every stored record, open or settled (memory, then the index).
    pub fn records(&self) -> Result<Vec<(TenantId, Record)>, StoreError> {
        let mut out = Vec::new();
        let mut seen: HashSet<Box<[u8]>> = HashSet::new();
        let mut bad_key = None;
        self.shared.for_each_resident(|key, value| {
            if let Value::Record(r) = value {
                match EntityKey::from_bytes(key) {
                    Ok(EntityKey::Record(t, _)) => out.push((t, r.clone())),
                    Ok(_) => {}
                    Err(e) => {
                        bad_key.get_or_insert(e);
                    }
                }
            }
            seen.insert(key.into());
        });
        if let Some(e) = bad_key {
            return Err(e);
        }
        self.shared.index().for_each(&mut |k, v| {
            if !seen.contains(k)
                && let Ok(Value::Record(r)) = decode_value(v)
                && let Ok(EntityKey::Record(t, _)) = EntityKey::from_bytes(k)
            {
                out.push((t, r));
            }
        })?;
        Ok(out)
    }

    /// One background sweep, inline.
    pub fn sweep_now(&self) -> Result<SweepReport, StoreError> {
        let now = self.shared.now();
        let mut report = SweepReport::default();
        for (t, cmd) in sweep_candidates(&self.shared, now)? {
            match self.execute_now(&t, cmd)? {
                Reply::Expired { ended: true } => report.expired += 1,
                Reply::Collected { removed: true } => report.collected += 1,
                _ => {}
            }
        }
        Ok(report)
    }
}

impl<F: Fs, I: Index> Store for InlineStore<F, I> {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(async move { self.execute_now(tenant, cmd) })
    }

    fn execute_batch<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmds: Vec<Command>,
    ) -> BoxFuture<'a, Vec<Result<Reply, StoreError>>> {
        let cmds = cmds.into_iter().map(|c| (tenant.clone(), c)).collect();
        Box::pin(async move { InlineStore::execute_batch(self, cmds) })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        Box::pin(async move { self.get_now(tenant, key) })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        Box::pin(async move { warnings_sync(&self.shared, tenant, task) })
    }

    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        Box::pin(async move {
            Ok(self
                .shared
                .principal(tenant, principal)?
                .map(|s| s.generation))
        })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move { self.sweep_now() })
    }

    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        Box::pin(async move { Ok(self.stats_now(stuck_after_ms)) })
    }

    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        Box::pin(async move { Ok(self.shared.now()) })
    }

    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        // Inline: deterministic, on the caller's thread.
        Box::pin(async move { scan_sync(&self.shared, tenant, after, max) })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { health_sync(&self.shared, self.inner.lock().closed) })
    }

    fn export(&self) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            health_sync(&self.shared, self.inner.lock().closed)?;
            Frozen::export(self.shared.clone()).await
        })
    }

    fn fence_floor(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { Ok(self.shared.fence_floor()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::OsFs;
    use crate::index::FjallIndex;
    use settle_core::testkit::*;
    use settle_core::{ClaimDecision, Fence, Reply};

    type Inline = InlineStore<OsFs, FjallIndex>;

    /// The store inline (checkpoints at known points) in `dir`.
    fn open_inline(dir: &Path) -> Inline {
        let opts = EmbeddedOptions {
            segment_bytes: 16 * 1024,
            ..EmbeddedOptions::default()
        };
        let index = FjallIndex::open(&dir.join("index")).unwrap();
        InlineStore::open(&OsFs, dir, index, opts).unwrap()
    }

    fn key_set_len(store: &Inline) -> usize {
        store.shared.listed_keys()
    }

    /// The listing's sorted key set keeps the records in memory only: a
    /// record claimed and settled within one segment leaves it at the
    /// checkpoint that evicts it (it is never inserted), one still open
    /// stays, and one settled in a later segment leaves then.
    #[test]
    fn the_sorted_key_set_holds_exactly_the_records_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_inline(dir.path());
        // A listing turns the key sets on (a store nobody listed keeps none).
        assert_eq!(key_set_len(&store), 0);
        let t = TenantId::new("acme").unwrap();
        let mut open = Vec::new();
        for i in 0..20 {
            let k = format!("k-{i:02}");
            let Reply::Claim(ClaimDecision::Execute(g)) = store
                .execute_now(&t, claim(&k, 1, binding("a", 0)))
                .unwrap()
            else {
                panic!()
            };
            if i % 4 == 0 {
                open.push((k, g.fence));
            } else {
                store
                    .execute_now(&t, settle(&k, g.fence, 1, binding("a", 0), completed(1)))
                    .unwrap();
            }
        }
        // Not folded yet (a listing would fold them): the checkpoint below
        // meets them as fresh keys.
        let s = &store.shared;
        assert_eq!(s.sorted_keys() + s.pending_keys(), 20);
        store.checkpoint_now().unwrap();
        assert_eq!(key_set_len(&store), open.len());
        assert_eq!(store.resident(), open.len());
        for (k, fence) in &open {
            store
                .execute_now(&t, settle(k, *fence, 1, binding("a", 0), completed(1)))
                .unwrap();
        }
        store.checkpoint_now().unwrap();
        assert_eq!(key_set_len(&store), 0);
        assert_eq!(store.resident(), 0);
    }

    /// Until the first listing no key set is kept; that listing finds
    /// every record in memory (recovered at open or published since), and
    /// from then on the set follows the map as above.
    #[test]
    fn the_first_listing_sorts_in_what_memory_holds_and_the_sets_follow_from_then() {
        let dir = tempfile::tempdir().unwrap();
        let t = TenantId::new("acme").unwrap();
        let claim_only = |store: &Inline, k: &str| {
            let Reply::Claim(ClaimDecision::Execute(g)) =
                store.execute_now(&t, claim(k, 1, binding("a", 0))).unwrap()
            else {
                panic!()
            };
            g.fence
        };
        {
            let store = open_inline(dir.path());
            claim_only(&store, "before-restart");
            store.close();
        }
        let store = open_inline(dir.path());
        let s = &store.shared;
        let mut fences: Vec<(String, Option<Fence>)> = vec![("before-restart".into(), None)];
        for i in 0..30 {
            let k = format!("k-{i:02}");
            let f = claim_only(&store, &k);
            if i % 3 == 0 {
                fences.push((k, Some(f)));
            } else {
                store
                    .execute_now(&t, settle(&k, f, 1, binding("a", 0), completed(1)))
                    .unwrap();
            }
        }
        store.checkpoint_now().unwrap();
        // Nothing was kept while nobody listed.
        assert_eq!(s.sorted_keys() + s.pending_keys(), 0);
        let listed = scan_sync(&store.shared, &t, None, 1000).unwrap();
        let keys: Vec<String> = listed.records.iter().map(|r| r.key.to_string()).collect();
        assert_eq!(keys.len(), 31, "{keys:?}");
        // The sorted set holds exactly the open records, all in memory.
        assert_eq!(key_set_len(&store), fences.len());
        assert_eq!(store.resident(), fences.len());
        let fresh = claim_only(&store, "after-listing");
        assert_eq!(s.pending_keys(), 1);
        fences.push(("after-listing".into(), Some(fresh)));
        for (k, f) in &fences {
            if let Some(f) = f {
                store
                    .execute_now(&t, settle(k, *f, 1, binding("a", 0), completed(1)))
                    .unwrap();
            }
        }
        store.checkpoint_now().unwrap();
        store.checkpoint_now().unwrap();
        // Left: the record claimed before the restart (still open).
        assert_eq!(key_set_len(&store), 1);
        assert_eq!(store.resident(), 1);
        assert_eq!(
            scan_sync(&store.shared, &t, None, 1000)
                .unwrap()
                .records
                .len(),
            32
        );
    }
}
