//! The checkpointer: moves sealed log segments into the index, one at a
//! time, then deletes each segment and evicts from memory what may leave.
//! It is the only evictor: a record leaves the map only here, only once
//! the index holds it durably and its batch is published, and only if no
//! later batch changed it (see [`Shared::evict`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use settle_ledger::StoreError;

use super::reclaim::Evicted;
use super::shared::Shared;
use super::{CkptMsg, Hasher, OnDrop, io_err};
use crate::codec::{Entry, decode_frames};
use crate::fs::Fs;
use crate::index::{CheckpointItem, Index, Meta};
use crate::pace::Pacer;
use crate::wal::{self, CheckpointStep, Faults, first_nonzero};

/// Moves sealed segments into the index, one segment at a time (so memory
/// stays bounded by one segment however far behind it is).
pub struct Checkpointer<F: Fs, I: Index> {
    pub shared: Arc<Shared<I>>,
    pub fs: F,
    pub wal_dir: PathBuf,
    /// The last completed checkpoint.
    pub meta: Meta,
    pub faults: Option<Arc<Faults>>,
    /// Record keys the index's `open` keyspace may list: those a checkpoint
    /// of this process wrote open, and every record in memory at open (a
    /// superset of what earlier processes listed and still matters). Only
    /// these get a tombstone there once they are no longer open.
    pub listed: std::collections::HashSet<Box<[u8]>, Hasher>,
    /// The segment being checkpointed, read into the same buffer each time:
    /// a fresh 64 MiB buffer per checkpoint cost its page faults and the
    /// kernel's zeroing of every page (a fifth of the checkpointer's CPU).
    pub read_buf: Vec<u8>,
    /// The table writes take turns with the log's syncs.
    pub pacer: Arc<Pacer>,
    /// Where evicted states go to be freed ([`super::Reclaimer`]); `None`: freed
    /// at once.
    pub reclaim: Option<Sender<Evicted>>,
}

impl<F: Fs, I: Index> Checkpointer<F, I> {
    /// Checkpoints every segment after the last checkpoint up to `seq`.
    pub fn run_to(&mut self, seq: u64) -> Result<(), StoreError> {
        if seq <= self.meta.checkpoint_seq {
            return Ok(());
        }
        let segments = wal::segments(&self.fs, &self.wal_dir).map_err(io_err)?;
        for (s, path) in segments {
            if s <= self.meta.checkpoint_seq || s > seq {
                continue;
            }
            if s != self.meta.checkpoint_seq + 1 {
                return Err(StoreError::Corrupt(format!(
                    "log segment {} is missing",
                    self.meta.checkpoint_seq + 1
                )));
            }
            if !self.one(s, &path)? {
                break;
            }
        }
        Ok(())
    }

    /// Ingests the newest state of every entity in segment `seq` into the
    /// index, makes it durable, records the checkpoint, deletes the
    /// segment, then evicts from memory what may leave it. The order is
    /// what makes a crash at any point harmless (docs/design.md).
    /// `Ok(false)`: halted by a fault, nothing done.
    fn one(&mut self, seq: u64, path: &std::path::Path) -> Result<bool, StoreError> {
        Faults::before_checkpoint(&self.faults);
        if Faults::halted(&self.faults) {
            return Ok(false);
        }
        let started = Instant::now();
        let mut buf = std::mem::take(&mut self.read_buf);
        let done = self.ingest_segment(seq, path, &mut buf);
        self.read_buf = buf;
        done?;
        if let Some(f) = &self.faults {
            f.checkpoints.fetch_add(1, Ordering::SeqCst);
        }
        tracing::debug!(
            seq,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "checkpoint"
        );
        Ok(true)
    }

    /// [`Checkpointer::one`] on the segment read into `buf`.
    fn ingest_segment(
        &mut self,
        seq: u64,
        path: &std::path::Path,
        buf: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        let started = Instant::now();
        wal::read_segment_into(&self.fs, path, buf)?;
        let buf = &buf[..];
        let frames = decode_frames(buf, seq)?;
        if let Some(x) = first_nonzero(buf, frames.valid) {
            return Err(StoreError::Corrupt(format!(
                "sealed segment {} is damaged at byte {} (non-zero byte at {x})",
                path.display(),
                frames.valid
            )));
        }
        let mut meta = self.meta;
        meta.checkpoint_seq = seq;
        // The newest entry per key (later batches win), borrowed from the segment bytes.
        // Sized for every entry up front: growing it rehashed every key
        // several times per segment.
        let entries = frames.batches.iter().map(|b| b.entries.len()).sum();
        let mut newest: HashMap<&[u8], (u64, Entry<'_>), Hasher> =
            HashMap::with_capacity_and_hasher(entries, Hasher::default());
        for b in frames.batches {
            if b.lsn != meta.checkpoint_lsn + 1 {
                return Err(StoreError::Corrupt(format!(
                    "{}: batch {} where {} was expected",
                    path.display(),
                    b.lsn,
                    meta.checkpoint_lsn + 1
                )));
            }
            meta.checkpoint_lsn = b.lsn;
            meta.next_fence = meta.next_fence.max(b.next_fence);
            meta.disputed = Some(b.disputed);
            for e in b.entries {
                newest.insert(e.key, (b.lsn, e));
            }
        }
        let taken: Vec<(u64, Entry<'_>)> = newest.into_values().collect();
        // Sorted as positions in `taken`: far fewer bytes to move than
        // the entries themselves.
        let order = sorted_by_key(taken.iter().map(|(_, e)| e.key));
        let items: Vec<CheckpointItem<'_>> = order
            .iter()
            .map(|&i| {
                let e = &taken[i].1;
                CheckpointItem {
                    key: e.key,
                    open: e.open,
                    expires_at: e.expires_at,
                    value: e.value,
                    // (Most stores list nothing: no hashing then.)
                    listed: !self.listed.is_empty() && self.listed.contains(e.key),
                }
            })
            .collect();
        drop(order);
        if Faults::take_checkpoint(&self.faults) {
            return Err(StoreError::Io("injected checkpoint failure".into()));
        }
        let prepared = Instant::now();
        // Before they can be in the index (and long before they leave the map).
        self.shared.ingesting(items.iter().map(|it| it.key));
        let pacer = &self.pacer;
        self.shared.index().ingest(&items, &|| pacer.step())?;
        for it in items.iter().filter(|it| it.key.first() == Some(&b'r')) {
            if it.open {
                self.listed.insert(it.key.into());
            } else if it.listed {
                self.listed.remove(it.key);
            }
        }
        Faults::step(&self.faults, CheckpointStep::TablesWritten);
        let written = Instant::now();
        self.shared.index().commit_meta(&meta)?;
        Faults::step(&self.faults, CheckpointStep::Persisted);
        let persisted = Instant::now();
        // The index now holds everything the segment holds: drop it.
        let pacer = &self.pacer;
        self.fs
            .remove_paced(path, &|| pacer.step())
            .map_err(io_err)?;
        self.fs.sync_dir(&self.wal_dir).map_err(io_err)?;
        Faults::step(&self.faults, CheckpointStep::SegmentDeleted);
        let removed = Instant::now();
        // The log thread seals a segment as soon as its last frame is
        // durable; the writer publishes that batch a moment later. Evicting
        // before then would keep the state it is about to publish in memory
        // for good (an eviction matches each key's batch).
        if self.shared.wait_published(meta.checkpoint_lsn) {
            self.evict(meta.checkpoint_lsn, &taken);
        }
        self.meta = meta;
        // Each step's time: which one a slow log sync came with.
        let ms = |a: Instant, b: Instant| b.duration_since(a).as_millis() as u64;
        tracing::debug!(
            entities = taken.len(),
            seq,
            read_sort_ms = ms(started, prepared),
            tables_ms = ms(prepared, written),
            meta_ms = ms(written, persisted),
            remove_ms = ms(persisted, removed),
            evict_ms = ms(removed, Instant::now()),
            "checkpoint ingested"
        );
        Ok(())
    }

    /// Evicts from the map what the checkpoint of `taken` (up to batch
    /// `last`, published) made durable, unless a later batch changed it
    /// since, and hands the evicted states to the reclaim thread.
    fn evict(&self, last: u64, taken: &[(u64, Entry<'_>)]) {
        let gone = self
            .shared
            .evict(last, taken.iter().map(|(lsn, e)| (*lsn, e.key)));
        // Freeing the evicted states (cold memory the writer allocated) was
        // a sixth of the checkpointer's time: handed to the reclaim thread,
        // or freed here when that thread is behind (or absent).
        if let Some(tx) = &self.reclaim {
            // Refused (full or gone): dropped here with the error.
            let _ = tx.try_send(gone);
        }
        Faults::step(&self.faults, CheckpointStep::Evicted);
    }

    /// The checkpointer thread's loop.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(mut self, rx: Receiver<CkptMsg>) {
        let shared = self.shared.clone();
        let _alive = OnDrop(move || shared.checkpointer_stopped());
        for msg in rx {
            match msg {
                CkptMsg::Sealed(seq) => {
                    if self.shared.is_poisoned() {
                        continue;
                    }
                    if let Err(e) = self.run_to(seq) {
                        tracing::error!(error = %e, "checkpoint failed; failing closed");
                        self.shared.poison();
                    }
                }
                CkptMsg::Stop(done) => {
                    let _ = done.send(());
                    return;
                }
            }
        }
    }
}

/// The positions of `keys` in byte order of the keys, equal keys in the
/// order given (as sorting `(key, position)` pairs would give), comparing
/// integers where it can:
/// a segment's keys share long prefixes (kind, tenant, often the key's
/// own), so a plain sort spent most of its time in `memcmp` over equal
/// bytes. Keys are grouped by their first byte; within a group every key
/// shares the group's common prefix, and the 8 bytes after it (zero
/// padded), read as a big-endian integer, order any two keys they tell
/// apart; only keys equal there are compared whole.
fn sorted_by_key<'a>(keys: impl ExactSizeIterator<Item = &'a [u8]>) -> Vec<usize> {
    let all: Vec<&[u8]> = keys.collect();
    // The common prefix of each first byte's keys (`usize::MAX`: none seen).
    let mut common = [usize::MAX; 256];
    let mut first: [&[u8]; 256] = [&[]; 256];
    for &k in &all {
        let Some(&b) = k.first() else { continue };
        let c = &mut common[b as usize];
        if *c == usize::MAX {
            *c = k.len();
            first[b as usize] = k;
        } else {
            let f = first[b as usize];
            let n = (*c).min(k.len());
            *c = f[..n]
                .iter()
                .zip(&k[..n])
                .position(|(x, y)| x != y)
                .unwrap_or(n);
        }
    }
    // Each key as one integer: its group (first byte + 1; 0 for the empty
    // key, never an entity key) in bits 96.., the word in bits 32..96,
    // its position in the low 32 bits. Integers sort with a fraction of
    // the instructions a tuple comparison takes; keys equal in group and
    // word are then sorted whole, run by run.
    assert!(
        u32::try_from(all.len()).is_ok(),
        "a segment holds fewer than 2^32 entries"
    );
    let mut tagged: Vec<u128> = all
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let (group, word) = match k.first() {
                None => (0u128, 0u64),
                Some(&b) => {
                    let rest = &k[common[b as usize]..];
                    let mut word = [0u8; 8];
                    let n = rest.len().min(8);
                    word[..n].copy_from_slice(&rest[..n]);
                    (u128::from(b) + 1, u64::from_be_bytes(word))
                }
            };
            group << 96 | u128::from(word) << 32 | i as u128
        })
        .collect();
    tagged.sort_unstable();
    let position = |t: &u128| (*t as u32) as usize;
    let mut order: Vec<usize> = Vec::with_capacity(tagged.len());
    for run in tagged.chunk_by(|a, b| a >> 32 == b >> 32) {
        let start = order.len();
        order.extend(run.iter().map(position));
        if run.len() > 1 {
            order[start..].sort_unstable_by(|&a, &b| all[a].cmp(all[b]).then(a.cmp(&b)));
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The checkpointer's sort gives what sorting by the whole key
        /// gives: keys of few bytes (so that prefixes, equal words and
        /// keys that are prefixes of others are common), any first byte.
        #[test]
        fn sorted_by_key_sorts_as_bytes_do(
            keys in proptest::collection::vec(
                proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), Just(b'r'), any::<u8>()], 0..20),
                0..200,
            ),
            prefix in proptest::collection::vec(any::<u8>(), 0..12),
        ) {
            // Half the keys share a long prefix, as a segment's do.
            let keys: Vec<Vec<u8>> = keys
                .into_iter()
                .enumerate()
                .map(|(i, k)| if i % 2 == 0 { [&prefix[..], &k[..]].concat() } else { k })
                .collect();
            let order = sorted_by_key(keys.iter().map(|k| &k[..]));
            // Equal keys keep their order (the checkpointer keeps the last).
            let got: Vec<(&[u8], usize)> = order.iter().map(|&i| (&keys[i][..], i)).collect();
            let mut want: Vec<(&[u8], usize)> = keys.iter().enumerate().map(|(i, k)| (&k[..], i)).collect();
            want.sort();
            prop_assert_eq!(got, want);
            let mut seen = order.clone();
            seen.sort();
            prop_assert_eq!(seen, (0..keys.len()).collect::<Vec<_>>());
        }
    }
}
