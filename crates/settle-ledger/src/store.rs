//! The boundary every engine implements.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use settle_core::{
    Command, Key, Principal, Record, RefusalCode, Reply, TaskId, TenantId, Timestamp, Warning,
};
use settle_portable::Entity;

use crate::inspect::Scan;
use crate::rounds::{Placement, Rounds};

/// A boxed, sendable future (keeps [`Store`] object-safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A failure of the engine, not a protocol answer. Callers get an error,
/// never a receipt, and nothing was acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A write or fsync failed; the engine now refuses writes until reopened.
    #[error("storage failure: {0}")]
    Io(String),
    /// An earlier write failed; the store fails closed until it is reopened.
    #[error("the store refuses writes after an earlier storage failure; reopen it")]
    Poisoned,
    /// The store is shutting down.
    #[error("the store is closed")]
    Closed,
    /// The database reported an error (PostgreSQL).
    #[error("database error: {0}")]
    Database(String),
    /// Stored data failed its checksum or format check.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// A commit was interrupted and its fate cannot be established (the
    /// database may or may not have committed it). Never a receipt: the
    /// caller retries, and the retry learns the truth from the record.
    #[error("commit outcome in doubt: {0}")]
    InDoubt(String),
    /// The engine is over its queue or backlog bound; nothing was written.
    /// The caller should retry after the hint.
    #[error("overloaded: retry after {retry_after_ms} ms")]
    Overloaded {
        /// How long to wait before retrying, in ms.
        retry_after_ms: u64,
    },
    /// The engine does not offer this operation (an export from a test store).
    #[error("not supported by this engine: {0}")]
    Unsupported(String),
}

impl StoreError {
    /// The retry hint for an overload, if this is one.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            StoreError::Overloaded { retry_after_ms } => Some(*retry_after_ms),
            _ => None,
        }
    }
}

/// Result of a background sweep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Leases ended by expiry or revocation.
    pub expired: u64,
    /// Terminal records collected after their retention.
    pub collected: u64,
}

/// Gauges over the records that are not settled (the ones an operator must watch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Non-terminal records.
    pub open: u64,
    /// Non-terminal records at `pending` (running ones included).
    pub pending: u64,
    /// Non-terminal records at `unknown`.
    pub unknown: u64,
    /// Non-terminal records at `conflict`.
    pub conflict: u64,
    /// Records with `reconcile_required` set.
    pub reconcile_required: u64,
    /// Non-terminal, no live lease, untouched for `stuck_after_s`.
    pub stuck: u64,
    /// Records refused under SPEC §6.9 that the engine knows of (a receipt
    /// from the future; the in-memory store also counts stored records that
    /// break a §6 invariant, which the rules refuse the same way).
    pub refused: u64,
    /// Records marked `disputed` (any status), counted from the store so
    /// the gauge survives restarts.
    pub disputed: u64,
    /// Stored records that cannot be decoded: skipped by the sweep, and
    /// every call on their key answers `record_refused`.
    pub undecodable: u64,
}

impl StoreStats {
    /// Adds one open record to the gauges.
    pub fn count(&mut self, r: &Record, now: Timestamp, stuck_after_ms: u64) {
        use settle_core::Status;
        if r.status.is_terminal() {
            return;
        }
        self.open += 1;
        match r.status {
            Status::Pending => self.pending += 1,
            Status::Unknown => self.unknown += 1,
            Status::Conflict => self.conflict += 1,
            _ => {}
        }
        if r.reconcile_required {
            self.reconcile_required += 1;
        }
        if r.is_stuck(now, stuck_after_ms) {
            self.stuck += 1;
        }
    }
}

/// "Run this command against the core, atomically and durably."
///
/// An engine decides nothing: it loads the state named by
/// [`Command::target`], calls [`settle_core::apply`] with its clock and its
/// next fence, and makes the new state durable before the future resolves.
/// A reply is never returned for a write that is not durable.
pub trait Store: Send + Sync + 'static {
    /// Applies one command; resolves after the new state is durable.
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>>;

    /// Applies `cmds` in order, as if one after another (a later command
    /// sees what every earlier one left, on any record, principal or
    /// task); resolves once every result is durable, one result per
    /// command, in order. The batch is not atomic: each command succeeds
    /// or fails on its own.
    ///
    /// This default runs the commands in rounds ([`crate::rounds`]):
    /// consecutive commands that commute (distinct records, no generation
    /// changed) run concurrently, so an engine with group commit gathers
    /// them into one transaction; a repeated key or task starts a new
    /// round, and a command that may change a principal's generation (a
    /// revoke, a claim above the generation known so far) runs alone
    /// between rounds. An engine that applies a whole batch in order
    /// itself overrides it.
    fn execute_batch<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmds: Vec<Command>,
    ) -> BoxFuture<'a, Vec<Result<Reply, StoreError>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(cmds.len());
            let mut plan = Rounds::new();
            let mut round: Vec<Command> = Vec::new();
            for cmd in cmds {
                match plan.place(&cmd) {
                    Placement::Join => round.push(cmd),
                    Placement::NextRound => {
                        run_round(self, tenant, std::mem::take(&mut round), &mut out).await;
                        round.push(cmd);
                    }
                    Placement::Alone => {
                        run_round(self, tenant, std::mem::take(&mut round), &mut out).await;
                        let result = self.execute(tenant, cmd.clone()).await;
                        if let Ok(reply) = &result {
                            plan.learn(&cmd, reply);
                        }
                        out.push(result);
                    }
                }
            }
            run_round(self, tenant, round, &mut out).await;
            out
        })
    }

    /// The `get` view at the store's `now`: `Ok(None)` for an unknown or
    /// collected key, `Err(RecordRefused)` for a record from the future.
    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>>;

    /// The warnings of a task.
    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>>;

    /// A principal's current generation (0 for one never seen; SPEC §7
    /// `GET /v1/principals/{principal}`), or `Err(RecordRefused)` when its
    /// stored state cannot be decoded.
    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>>;

    /// Ends lapsed leases and collects expired terminal records (the same
    /// rules also run lazily on every access).
    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>>;

    /// Gauges over open records.
    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>>;

    /// The store's clock.
    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>>;

    /// At most `max` records of `tenant` in key order, strictly after
    /// `after`, each as `get` shows it at the store's `now` (the inspection
    /// API of SPEC §9 is built on this; see [`crate::inspect`]). Must not
    /// hold up writes for longer than it takes to copy `max` records.
    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>>;

    /// Readiness: `Ok` only if the store can accept writes right now (not
    /// poisoned by a failed fsync, its writer alive, its database reachable
    /// with durable settings). `/readyz` answers 503 on `Err`.
    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// One consistent snapshot of every stored entity, streamed in the
    /// portable format's canonical order (SPEC §12): every write
    /// acknowledged before the call is in it, none half-applied, none
    /// twice. Writes go on meanwhile.
    fn export(&self) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        Box::pin(async { Err(StoreError::Unsupported("export".into())) })
    }

    /// The fence counter now: every fence granted so far is below it.
    fn fence_floor(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async { Err(StoreError::Unsupported("fence_floor".into())) })
    }
}

/// What [`Store::export`] hands out: the snapshot's fence counter and its
/// entities, in chunks, in the portable format's canonical order.
pub struct Snapshot {
    /// The engine's name for the export header (`embedded`, `postgres`, `memory`).
    pub engine: &'static str,
    /// The fence counter at the snapshot.
    pub fence_floor: u64,
    /// How many fences one claim may consume on this engine (the header's
    /// `fences_per_claim_max`, SPEC §12).
    pub fences_per_claim_max: u64,
    /// The entities, then [`Part::End`]; an `Err` ends the stream, and the
    /// export is then incomplete (its file gets no trailer, so it is never
    /// read back). Read it with [`Snapshot::next_chunk`].
    pub entities: tokio::sync::mpsc::Receiver<Result<Part, StoreError>>,
}

/// One message of a [`Snapshot`]'s stream.
#[derive(Debug)]
pub enum Part {
    /// The next entities, in canonical order.
    Entities(Vec<Entity>),
    /// The producer sent every entity of the snapshot: only now may an
    /// export write its trailer.
    End,
}

impl Snapshot {
    /// The next chunk of entities; `Ok(None)` once the producer said the
    /// snapshot is whole. A producer that goes away without saying so (it
    /// panicked, its task or thread ended early) is an error: an export
    /// whose producer failed never writes a trailer (SPEC §12).
    pub async fn next_chunk(&mut self) -> Result<Option<Vec<Entity>>, StoreError> {
        match self.entities.recv().await {
            Some(Ok(Part::Entities(chunk))) => Ok(Some(chunk)),
            Some(Ok(Part::End)) => Ok(None),
            Some(Err(e)) => Err(e),
            None => Err(StoreError::Io(
                "the export's producer stopped before the end of the snapshot".into(),
            )),
        }
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("engine", &self.engine)
            .field("fence_floor", &self.fence_floor)
            .finish_non_exhaustive()
    }
}

/// Runs one round's commands concurrently, appending their results in order.
async fn run_round<S: Store + ?Sized>(
    store: &S,
    tenant: &TenantId,
    round: Vec<Command>,
    out: &mut Vec<Result<Reply, StoreError>>,
) {
    match round.len() {
        0 => {}
        1 => {
            let cmd = round.into_iter().next().expect("one command");
            out.push(store.execute(tenant, cmd).await);
        }
        _ => out.extend(
            futures::future::join_all(round.into_iter().map(|c| store.execute(tenant, c))).await,
        ),
    }
}

impl<S: Store + ?Sized> Store for Arc<S> {
    fn execute<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmd: Command,
    ) -> BoxFuture<'a, Result<Reply, StoreError>> {
        (**self).execute(tenant, cmd)
    }
    fn execute_batch<'a>(
        &'a self,
        tenant: &'a TenantId,
        cmds: Vec<Command>,
    ) -> BoxFuture<'a, Vec<Result<Reply, StoreError>>> {
        (**self).execute_batch(tenant, cmds)
    }
    fn get<'a>(
        &'a self,
        tenant: &'a TenantId,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Result<Option<Record>, RefusalCode>, StoreError>> {
        (**self).get(tenant, key)
    }
    fn warnings<'a>(
        &'a self,
        tenant: &'a TenantId,
        task: &'a TaskId,
    ) -> BoxFuture<'a, Result<Vec<Warning>, StoreError>> {
        (**self).warnings(tenant, task)
    }
    fn generation<'a>(
        &'a self,
        tenant: &'a TenantId,
        principal: &'a Principal,
    ) -> BoxFuture<'a, Result<Result<u64, RefusalCode>, StoreError>> {
        (**self).generation(tenant, principal)
    }
    fn sweep(&self) -> BoxFuture<'_, Result<SweepReport, StoreError>> {
        (**self).sweep()
    }
    fn stats(&self, stuck_after_ms: u64) -> BoxFuture<'_, Result<StoreStats, StoreError>> {
        (**self).stats(stuck_after_ms)
    }
    fn now(&self) -> BoxFuture<'_, Result<Timestamp, StoreError>> {
        (**self).now()
    }
    fn scan<'a>(
        &'a self,
        tenant: &'a TenantId,
        after: Option<&'a Key>,
        max: usize,
    ) -> BoxFuture<'a, Result<Scan, StoreError>> {
        (**self).scan(tenant, after, max)
    }
    fn health(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        (**self).health()
    }

    fn export(&self) -> BoxFuture<'_, Result<Snapshot, StoreError>> {
        (**self).export()
    }

    fn fence_floor(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        (**self).fence_floor()
    }
}

/// A store's clock: a source (the wall clock, or the database's clock) plus
/// a skew that tests move to make time pass without sleeping.
#[derive(Clone, Default)]
pub struct Clock {
    skew_ms: Arc<AtomicI64>,
    /// Replaces the wall clock (tests that watch when the clock is read).
    source: Option<Arc<dyn Fn() -> Timestamp + Send + Sync>>,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clock")
            .field("skew_ms", &self.skew_ms())
            .field("custom_source", &self.source.is_some())
            .finish()
    }
}

impl Clock {
    /// The wall clock, unskewed.
    pub fn system() -> Clock {
        Clock::default()
    }
    /// A clock reading `source` instead of the wall clock (plus the skew).
    pub fn with_source(source: impl Fn() -> Timestamp + Send + Sync + 'static) -> Clock {
        Clock {
            skew_ms: Arc::default(),
            source: Some(Arc::new(source)),
        }
    }
    /// Moves this clock (and every store sharing it) by `ms`; negative goes back.
    pub fn advance(&self, ms: i64) {
        self.skew_ms.fetch_add(ms, Ordering::SeqCst);
    }
    /// How far this clock is moved from its source, in ms.
    pub fn skew_ms(&self) -> i64 {
        self.skew_ms.load(Ordering::SeqCst)
    }
    /// `source` plus the skew.
    pub fn from_source(&self, source: Timestamp) -> Timestamp {
        Timestamp((source.0 as i64).saturating_add(self.skew_ms()).max(0) as u64)
    }
    /// The wall clock (or the custom source) plus the skew.
    pub fn now(&self) -> Timestamp {
        let source = match &self.source {
            Some(f) => f(),
            None => Timestamp::from_system_time(std::time::SystemTime::now()),
        };
        self.from_source(source)
    }
}

/// The message of a caught panic (an engine that catches one in a batch
/// logs it; the simulator reports it as a violation).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}
