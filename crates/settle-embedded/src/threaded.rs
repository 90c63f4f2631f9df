//! The threaded store, [`EmbeddedStore`]: a writer thread, a log thread
//! and a checkpointer (and the reclaim and writeback threads) over the
//! engine; callers wait on a reply, reads run on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use parking_lot::Mutex;
use settle_core::{Command, Key, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning};
use settle_ledger::inspect::Scan;
use settle_ledger::{BoxFuture, Snapshot, Store, StoreError, StoreStats, SweepReport};

use crate::fs::{Fs, OsFs, create_dir_all_durable};
use crate::index::{FjallIndex, Index};
use crate::open::{io, recover_engine};
use crate::options::EmbeddedOptions;
use crate::pace::Pacer;
use crate::portable::Frozen;
use crate::reads::{get_sync, health_sync, scan_sync, stats_sync, sweep_candidates, warnings_sync};
use crate::{CkptMsg, Core, LogThread, Msg, SealSink, Shared, Writer, engine};

/// Starts a store thread named `name`.
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, StoreError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(io)
}

/// The writeback thread steps at most this often: a step lists the index's
/// table directories.
const WRITEBACK_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// The embedded durable store: a writer thread and a checkpointer thread
/// over the log on `F` and the index `I` (by default the real filesystem
/// and fjall).
pub struct EmbeddedStore<F: Fs = OsFs, I: Index = FjallIndex> {
    shared: Arc<Shared<I>>,
    /// To the writer (ringing its doorbell).
    tx: engine::Ringing<Msg>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Stopped at close (ends the writeback thread).
    pacer: Arc<Pacer>,
    closed: AtomicBool,
    max_queue: usize,
    retry_after_ms: u64,
    _lock: F::Lock,
    dir: PathBuf,
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `dir`, recovering after a crash:
    /// the index as of its last checkpoint, then every whole frame of the log.
    pub fn open(
        dir: impl AsRef<Path>,
        opts: EmbeddedOptions,
    ) -> Result<Arc<EmbeddedStore>, StoreError> {
        let dir = dir.as_ref();
        let fs = OsFs;
        create_dir_all_durable(&fs, &dir.join("wal")).map_err(io)?;
        let lock = fs.lock(&dir.join("LOCK")).map_err(io)?;
        let index = FjallIndex::open(&dir.join("index"))?;
        // fjall created `index/` if it was new.
        fs.sync_dir(dir).map_err(io)?;
        EmbeddedStore::start(&fs, dir, lock, index, opts)
    }
}

impl<F: Fs, I: Index> EmbeddedStore<F, I> {
    /// Opens the store in `dir` on another filesystem and index (the
    /// simulated disk and the in-memory index, in tests).
    pub fn open_on(
        fs: &F,
        dir: impl AsRef<Path>,
        index: I,
        opts: EmbeddedOptions,
    ) -> Result<Arc<Self>, StoreError> {
        let dir = dir.as_ref();
        create_dir_all_durable(fs, &dir.join("wal")).map_err(io)?;
        let lock = fs.lock(&dir.join("LOCK")).map_err(io)?;
        EmbeddedStore::start(fs, dir, lock, index, opts)
    }

    fn start(
        fs: &F,
        dir: &Path,
        lock: F::Lock,
        index: I,
        opts: EmbeddedOptions,
    ) -> Result<Arc<Self>, StoreError> {
        let (ctx, crx) = crossbeam_channel::bounded::<CkptMsg>(opts.max_checkpoint_backlog.max(1));
        let (core, mut ckpt) = recover_engine(fs, dir, index, &opts, SealSink::Channel(ctx))?;
        let shared = core.shared.clone();
        let pacer = ckpt.pacer.clone();
        let (tx, rx) = crossbeam_channel::unbounded();
        // Ends after the checkpointer, which holds the sending side.
        let (rtx, rrx) = crossbeam_channel::bounded(engine::RECLAIM_BACKLOG);
        let reclaimer = engine::Reclaimer { rx: rrx };
        let rc = spawn("settle-reclaim", move || reclaimer.run())?;
        ckpt.reclaim = Some(rtx);
        let ck = spawn("settle-checkpoint", move || ckpt.run(crx))?;
        let Core { stage, log, .. } = core;
        // The writer gathers the next batch while the log thread makes the
        // last durable; `IN_FLIGHT` frames wait there at most (and one more
        // for a moment: the writer sends the next before it handles a
        // completion).
        let (stx, srx) = crossbeam_channel::bounded(engine::IN_FLIGHT);
        let (done_tx, done_rx) = crossbeam_channel::bounded(engine::IN_FLIGHT);
        let writer_bell = Arc::new(engine::Doorbell::default());
        let log_bell = Arc::new(engine::Doorbell::default());
        let log_thread = LogThread {
            log,
            rx: srx,
            synced: engine::Ringing {
                tx: done_tx,
                bell: writer_bell.clone(),
            },
            bell: log_bell.clone(),
        };
        let lt = spawn("settle-log", move || log_thread.run())?;
        let writer = Writer {
            stage,
            rx,
            tx: engine::Ringing {
                tx: stx,
                bell: log_bell,
            },
            synced: done_rx,
            bell: writer_bell.clone(),
        };
        let wr = spawn("settle-writer", move || writer.run())?;
        let mut threads = vec![wr, lt, ck, rc];
        // The index's own background writes (compactions) take turns with
        // the log too: one step after a sync, at most every few milliseconds.
        if let Some(mut step) = shared.index().background_writeback() {
            let p = pacer.clone();
            threads.push(spawn("settle-writeback", move || {
                p.run_after_syncs(WRITEBACK_EVERY, &mut step)
            })?);
        }
        Ok(Arc::new(EmbeddedStore {
            shared,
            tx: engine::Ringing {
                tx,
                bell: writer_bell,
            },
            threads: Mutex::new(threads),
            pacer,
            closed: AtomicBool::new(false),
            max_queue: opts.max_queue.max(1),
            retry_after_ms: opts.overload_retry_after_ms,
            _lock: lock,
            dir: dir.to_path_buf(),
        }))
    }

    /// Stops accepting commands, lets queued commits finish, checkpoints, joins the threads.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Msg::Close(tx)).is_ok() {
            let _ = rx.recv();
        }
        self.pacer.stop();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }

    /// Whether the store refuses writes after a storage failure.
    pub fn is_poisoned(&self) -> bool {
        self.shared.is_poisoned()
    }

    /// The directory the store was opened on.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Entities held in memory (open records plus what awaits a checkpoint).
    pub fn resident(&self) -> usize {
        self.shared.resident()
    }
}

impl<F: Fs, I: Index> Drop for EmbeddedStore<F, I> {
    fn drop(&mut self) {
        self.close();
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io(format!("blocking task failed: {e}")))
}

impl<F: Fs, I: Index> Store for EmbeddedStore<F, I> {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(async move {
            if self.shared.is_poisoned() {
                return Err(StoreError::Poisoned);
            }
            if self.closed.load(Ordering::Relaxed) {
                return Err(StoreError::Closed);
            }
            // Admission: a bounded queue, answered at once when full.
            if !self.shared.admit(1, self.max_queue) {
                return Err(StoreError::Overloaded {
                    retry_after_ms: self.retry_after_ms,
                });
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sent = self.tx.send(Msg::Exec(Box::new(engine::Exec {
                tenant: tenant.clone(),
                cmd,
                reply: tx,
            })));
            if sent.is_err() {
                self.shared.dequeued(1);
                return Err(StoreError::Closed);
            }
            rx.await.map_err(|_| {
                // The writer answers everything it takes, even on close: a
                // reply dropped unanswered means its thread is gone (and
                // readiness must say so now, not once it finished unwinding).
                self.shared.writer_stopped();
                StoreError::Closed
            })?
        })
    }

    /// The whole batch goes to the writer as one message: it is applied in
    /// order within one group commit (one `write` + `fdatasync`, shared with
    /// whatever else is queued), and answered once that is durable.
    fn execute_batch<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmds: Vec<Command>,
    ) -> BoxFuture<'a, Vec<Result<Reply, StoreError>>> {
        Box::pin(async move {
            let n = cmds.len();
            let all = |e: StoreError| (0..n).map(|_| Err(e.clone())).collect::<Vec<_>>();
            if n == 0 {
                return Vec::new();
            }
            if self.shared.is_poisoned() {
                return all(StoreError::Poisoned);
            }
            if self.closed.load(Ordering::Relaxed) {
                return all(StoreError::Closed);
            }
            // Admission counts every command; a batch is admitted whole or not at all.
            if !self.shared.admit(n, self.max_queue) {
                return all(StoreError::Overloaded {
                    retry_after_ms: self.retry_after_ms,
                });
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let sent = self.tx.send(Msg::Batch {
                tenant: tenant.clone(),
                cmds,
                reply: tx,
            });
            if sent.is_err() {
                self.shared.dequeued(n);
                return all(StoreError::Closed);
            }
            match rx.await {
                Ok(results) => results,
                Err(_) => {
                    self.shared.writer_stopped();
                    all(StoreError::Closed)
                }
            }
        })
    }

    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        // Reads never wait for the writer; the index may touch the disk, so
        // keep it off the async workers.
        let shared = self.shared.clone();
        let (tenant, key) = (tenant.clone(), key.clone());
        Box::pin(async move { blocking(move || get_sync(&shared, &tenant, &key)).await? })
    }

    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a settle_core::Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        let shared = self.shared.clone();
        let (tenant, principal) = (tenant.clone(), principal.clone());
        Box::pin(async move {
            blocking(move || Ok(shared.principal(&tenant, &principal)?.map(|s| s.generation)))
                .await?
        })
    }

    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        let shared = self.shared.clone();
        let (tenant, task) = (tenant.clone(), task.clone());
        Box::pin(async move { blocking(move || warnings_sync(&shared, &tenant, &task)).await? })
    }

    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        Box::pin(async move {
            let now = self.shared.now();
            let shared = self.shared.clone();
            let candidates = blocking(move || sweep_candidates(&shared, now)).await??;
            let mut report = SweepReport::default();
            for (t, cmd) in candidates {
                match self.execute(&t, cmd).await {
                    Ok(Reply::Expired { ended: true }) => report.expired += 1,
                    Ok(Reply::Collected { removed: true }) => report.collected += 1,
                    Ok(_) => {}
                    // Busy: the rest waits for the next sweep.
                    Err(StoreError::Overloaded { .. }) => break,
                    Err(e) => return Err(e),
                }
            }
            Ok(report)
        })
    }

    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        let shared = self.shared.clone();
        Box::pin(async move { blocking(move || stats_sync(&shared, stuck_after_ms)).await })
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
        let shared = self.shared.clone();
        let (tenant, after) = (tenant.clone(), after.cloned());
        Box::pin(async move {
            blocking(move || scan_sync(&shared, &tenant, after.as_ref(), max)).await?
        })
    }

    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move { health_sync(&self.shared, self.closed.load(Ordering::SeqCst)) })
    }

    fn export(&self) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async move {
            health_sync(&self.shared, self.closed.load(Ordering::SeqCst))?;
            Frozen::export(self.shared.clone()).await
        })
    }

    fn fence_floor(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move { Ok(self.shared.fence_floor()) })
    }
}
