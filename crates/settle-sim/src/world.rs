//! The simulated world: one seeded RNG, a virtual clock, an event queue
//! that is the network (delays, drops, duplicates, reordering), the store
//! process (crashes, restarts, fsync errors, clock jumps), the remote, and
//! the checkers. Everything runs on one thread in event order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use settle_core::{Command, Key, Limits, Principal, Reply, Revoke, TenantId};
use settle_ledger::{LedgerError, StoreError, panic_message};

use crate::check::Checker;
use crate::disk::{Crash, Rng};
use crate::remote::{QueryResult, Remote, WriteResult};
use crate::store::{EngineKind, SimStore};
use crate::worker::{Worker, WorkerSpec};

/// Where the simulated wall clock starts (2026-01-01, in ms).
pub const EPOCH_MS: u64 = 1_767_225_600_000;
/// The simulated run ends here (ms after the start) at the latest.
pub const HORIZON_MS: u64 = 120_000;
/// Records untouched this long are reported as stuck (SPEC default 3600 s).
pub const STUCK_AFTER_MS: u64 = 3_600_000;
/// The largest backward clock jump tested (see docs/testing.md).
pub const MAX_BACKWARD_JUMP_MS: u64 = 10_000;
/// The largest forward clock jump tested: 30 days (retention is a year).
pub const MAX_FORWARD_JUMP_MS: u64 = 30 * 24 * 3_600_000;

/// An injected fault (scheduled at a random time).
#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// Power loss now: unsynced writes dropped, kept or torn.
    Crash(Crash),
    /// Power loss during one of the next few syncs.
    PowerCutDuringSync(u64),
    /// The next fsync fails: the store must fail closed.
    FsyncError,
    /// The next index persist (checkpoint) fails: fail closed too.
    IndexPersistError,
    /// The store's clock jumps forward by this much.
    ClockForward(u64),
    /// The store's clock jumps back by this much.
    ClockBackward(u64),
    /// An operator revokes principal `n`.
    Revoke(usize),
}

/// Something that happens at a simulated instant. `w` is a worker's
/// index, `call` its call number (retransmissions keep it), `epoch` the
/// timer generation (a newer timer makes older ones stale).
#[derive(Clone, Debug)]
#[allow(missing_docs)] // the fields are described above
pub enum Ev {
    /// A worker's timer (request timeout, back-off, retry-after).
    Wake { w: usize, epoch: u64 },
    /// A worker's background heartbeat.
    Heartbeat { w: usize, epoch: u64 },
    /// A request reaches the ledger.
    ToLedger { w: usize, call: u64, cmd: Command },
    /// The ledger's answer reaches the worker (`Err`: 503).
    FromLedger {
        w: usize,
        call: u64,
        reply: Result<Reply, String>,
    },
    /// A worker's write or query reaches the remote.
    ToRemote { w: usize, call: u64, op: RemoteOp },
    /// The remote's answer reaches the worker.
    FromRemote { w: usize, call: u64, res: RemoteRes },
    /// An injected fault.
    Fault(Fault),
    /// The supervisor restarts the store process.
    Restart,
    /// The background sweep.
    Sweep,
    /// The reconciler's sweep (SPEC §11.10): a reconciler worker for every
    /// record that requires reconciliation.
    ReconcilerSweep,
}

/// A call to the remote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteOp {
    /// The effect's write under a fence.
    Write(settle_core::Fence),
    /// A reconcile query under a fence.
    Query(settle_core::Fence),
}

/// The remote's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteRes {
    /// To a write.
    Write(WriteResult),
    /// To a query.
    Query(QueryResult),
    /// No answer in time (the write may or may not have landed).
    Timeout,
}

/// Counters of one run.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Events processed.
    pub steps: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
}

impl Tally {
    /// Counts one fault of `kind`.
    pub fn fault(&mut self, kind: &'static str) {
        *self.faults.entry(kind).or_default() += 1;
    }
}

/// One line of a key's history.
#[derive(Clone, Debug)]
pub struct Line {
    /// Simulated ms since the start.
    pub at: u64,
    /// The key it concerns (`None`: global, e.g. a crash).
    pub key: Option<usize>,
    /// What happened.
    pub text: String,
}

/// The whole simulated world of one seed.
pub struct World {
    /// The one source of randomness.
    pub rng: Rng,
    /// Simulated time, ms since the start (never goes back).
    pub now: u64,
    /// The store's clock offset from simulated time (clock jumps).
    pub clock_offset: i64,
    clock_ms: Arc<AtomicU64>,
    queue: BTreeMap<(u64, u64), Ev>,
    seq: u64,
    /// The store under test.
    pub store: SimStore,
    /// The remote.
    pub remote: Remote,
    /// The workers.
    pub workers: Vec<Worker>,
    /// The keys (index = key number).
    pub keys: Vec<Key>,
    /// The principals (index = principal number) and their current generation.
    pub principals: Vec<(Principal, u64)>,
    /// Per key: the remote's status API cannot tell for it (the hooks of
    /// these keys always answer `unavailable`).
    pub opaque: Vec<bool>,
    /// The generator of what the reconciler adds (its sweeps' times).
    side: Rng,
    /// Whether the reconciler sweeps during the run.
    reconciler: bool,
    /// The tenant.
    pub tenant: TenantId,
    /// The checkers.
    pub check: Checker,
    /// Counters.
    pub tally: Tally,
    /// Everything that happened.
    pub history: Vec<Line>,
    /// Per-seed knobs (probabilities in per mille).
    pub knobs: Knobs,
    restart_failures: u32,
    /// Events past this simulated time are not run (ms).
    pub horizon: u64,
    /// The latest store clock reading so far (ms).
    clock_high: u64,
    /// The store restarted while its clock was behind `clock_high`.
    restarted_behind: bool,
    /// The fence the ledger granted to each (worker, call) claim, whether
    /// or not the answer arrived: a retransmission of that claim must not
    /// meet its own lease as `in_flight` (SPEC §4 rule 5a, §11.11).
    granted: HashMap<(usize, u64), settle_core::Fence>,
}

/// Probabilities (per mille) drawn once per seed, so seeds differ in kind
/// (all zero: no faults, the liveness phase).
#[derive(Clone, Copy, Debug, Default)]
pub struct Knobs {
    /// A request or answer is lost.
    pub drop: u64,
    /// A request or answer is delivered twice.
    pub dup: u64,
    /// A delivery is slow (up to seconds: reordering).
    pub slow: u64,
    /// A worker pauses before a step.
    pub pause: u64,
    /// The remote applies a write and its answer is lost.
    pub apply_then_timeout: u64,
    /// The remote refuses a write definitively.
    pub refuse: u64,
    /// A reconcile query cannot reach the remote.
    pub unavailable: u64,
}

impl World {
    /// A world for `seed` against `engine`, with the reconciler (SPEC
    /// §11.10) at work.
    pub fn new(seed: u64, engine: EngineKind) -> World {
        World::with(seed, engine, true)
    }

    /// A world for `seed` against `engine`; `reconciler` false is the world
    /// as it was before the reconciler and the hooks that cannot tell (for
    /// regression seeds found then). What the reconciler adds is drawn from
    /// a second generator, so the rest of a seed's world is the same.
    pub fn with(seed: u64, engine: EngineKind, reconciler: bool) -> World {
        let mut rng = Rng::new(seed);
        let mut side = Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15);
        let knobs = Knobs {
            drop: rng.below(120),
            dup: rng.below(80),
            slow: rng.below(150),
            pause: rng.below(60),
            apply_then_timeout: rng.below(150),
            refuse: rng.below(80),
            unavailable: rng.below(200),
        };
        let limits = Limits::default();
        let clock_ms = Arc::new(AtomicU64::new(EPOCH_MS));
        let store = SimStore::new(engine, clock_ms.clone(), limits);
        let nkeys = 1 + rng.below(4) as usize;
        let keys = (0..nkeys)
            .map(|i| Key::new(format!("op-{i}")).expect("a valid key"))
            .collect();
        let principals = (0..1 + rng.below(2) as usize)
            .map(|i| (Principal::new(format!("svc-{i}")).expect("valid"), 0))
            .collect();
        let opaque = (0..nkeys)
            .map(|_| reconciler && side.below(3) == 0)
            .collect();
        World {
            rng,
            now: 0,
            clock_offset: 0,
            clock_ms,
            queue: BTreeMap::new(),
            seq: 0,
            store,
            remote: Remote::default(),
            workers: Vec::new(),
            keys,
            principals,
            opaque,
            side,
            reconciler,
            tenant: TenantId::default_tenant(),
            check: Checker::new(nkeys, limits.lease_margin_ms),
            tally: Tally::default(),
            history: Vec::new(),
            knobs,
            restart_failures: 0,
            horizon: HORIZON_MS,
            clock_high: 0,
            restarted_behind: false,
            granted: HashMap::new(),
        }
    }

    /// A draw of `p` per mille from the side generator (what was added
    /// later draws from it, so each seed's world stays the same).
    pub fn side_chance(&mut self, p: u64) -> bool {
        self.side.below(1000) < p
    }

    /// A uniform draw in `[lo, hi)` from the side generator.
    pub fn side_between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.side.below(hi - lo)
    }

    /// A draw of `p` per mille.
    pub fn chance(&mut self, p: u64) -> bool {
        self.rng.below(1000) < p
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.rng.below(hi - lo + 1)
    }

    /// Schedules `ev` at `at` (events at the same instant keep their order).
    pub fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at.max(self.now), self.seq), ev);
    }

    /// Logs a line of history.
    pub fn log(&mut self, key: Option<usize>, text: impl Into<String>) {
        self.history.push(Line {
            at: self.now,
            key,
            text: text.into(),
        });
    }

    /// Moves the store's clock source to simulated time plus the offset.
    fn set_clock(&mut self) {
        let t = (EPOCH_MS as i64 + self.now as i64 + self.clock_offset).max(0) as u64;
        self.clock_ms.store(t, Ordering::SeqCst);
        if t >= self.clock_high {
            self.clock_high = t;
            self.restarted_behind = false;
        }
    }

    /// A network delay: usually milliseconds, sometimes seconds (so
    /// messages overtake each other).
    pub fn delay(&mut self) -> u64 {
        let slow = self.knobs.slow;
        if self.chance(slow) {
            self.between(200, 4_000)
        } else {
            self.between(1, 40)
        }
    }

    /// Sends `ev` over the network: dropped, delayed, or duplicated.
    pub fn send(&mut self, ev: Ev, key: usize, what: &str) {
        let (drop, dup) = (self.knobs.drop, self.knobs.dup);
        if self.chance(drop) {
            self.tally.fault(match ev {
                Ev::FromLedger { .. } => "lost_ack",
                Ev::FromRemote { .. } => "lost_remote_answer",
                _ => "lost_request",
            });
            self.log(Some(key), format!("network drops {what}"));
            return;
        }
        if self.chance(dup) {
            self.tally.fault("duplicated");
            let d = self.delay();
            self.at(self.now + d, ev.clone());
        }
        let d = self.delay();
        self.at(self.now + d, ev);
    }

    /// Schedules the seed's faults over the run.
    pub fn plan_faults(&mut self) {
        let n = self.rng.below(6);
        for _ in 0..n {
            let at = self.rng.below(HORIZON_MS / 2);
            let embedded = self.store.kind() == EngineKind::Embedded;
            let f = match self.rng.below(if embedded { 9 } else { 4 }) {
                0 => Fault::ClockForward(self.forward_jump()),
                1 => Fault::ClockBackward(self.between(1, MAX_BACKWARD_JUMP_MS)),
                2 | 3 => Fault::Revoke(self.rng.below(self.principals.len() as u64) as usize),
                4 => Fault::Crash(Crash::Drop),
                5 => Fault::Crash(if self.rng.below(2) == 0 {
                    Crash::Keep
                } else {
                    Crash::Tear(self.rng.next_u64())
                }),
                6 => Fault::PowerCutDuringSync(self.between(0, 4)),
                7 => Fault::FsyncError,
                _ => Fault::IndexPersistError,
            };
            self.at(at, Ev::Fault(f));
        }
        let mut t = 0;
        while t < HORIZON_MS {
            t += self.between(500, 5_000);
            self.at(t, Ev::Sweep);
        }
        let mut t = 0;
        while self.reconciler && t < HORIZON_MS {
            t += 2_000 + self.side.below(8_001);
            self.at(t, Ev::ReconcilerSweep);
        }
    }

    /// Forward jumps of any size up to 30 days, log-uniform.
    fn forward_jump(&mut self) -> u64 {
        let exp = self.rng.below(8) as u32; // 10^0 .. 10^7 s-ish
        let base = 10u64.pow(exp) * 1000 / 10;
        (base + self.rng.below(base.max(1) * 9)).clamp(1, MAX_FORWARD_JUMP_MS)
    }

    /// Runs the event loop until the queue is empty or the horizon passes.
    pub fn run(&mut self) {
        while let Some(((at, _), ev)) = self.queue.pop_first() {
            if at > self.horizon || !self.check.violations.is_empty() {
                break;
            }
            self.now = self.now.max(at);
            self.set_clock();
            self.tally.steps += 1;
            let key = match &ev {
                Ev::Wake { w, .. }
                | Ev::Heartbeat { w, .. }
                | Ev::ToLedger { w, .. }
                | Ev::FromLedger { w, .. }
                | Ev::ToRemote { w, .. }
                | Ev::FromRemote { w, .. } => Some(self.workers[*w].key),
                _ => None,
            };
            // A panic in the ledger (an assertion of the core) is a
            // violation of this step: keep the history that led to it.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step(ev)));
            if let Err(panic) = r {
                self.check.fail(key, "panic", panic_message(panic.as_ref()));
            }
        }
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Wake { w, epoch } => self.worker_event(w, Ev::Wake { w, epoch }),
            Ev::Heartbeat { w, epoch } => self.worker_event(w, Ev::Heartbeat { w, epoch }),
            e @ (Ev::FromLedger { .. } | Ev::FromRemote { .. }) => {
                let w = match e {
                    Ev::FromLedger { w, .. } | Ev::FromRemote { w, .. } => w,
                    _ => unreachable!(),
                };
                self.worker_event(w, e);
            }
            Ev::ToLedger { w, call, cmd } => self.ledger_call(w, call, cmd),
            Ev::ToRemote { w, call, op } => self.remote_call(w, call, op),
            Ev::Fault(f) => self.fault(f),
            Ev::Restart => self.restart(),
            Ev::Sweep => {
                if let Some(Err(e)) = self.store.sweep() {
                    self.log(None, format!("sweep failed: {e}"));
                }
                self.after_store_call();
            }
            Ev::ReconcilerSweep => self.reconciler_sweep(),
        }
    }

    /// A request arrives at the ledger: run it, check, answer.
    fn ledger_call(&mut self, w: usize, call: u64, cmd: Command) {
        let key = self.workers[w].key;
        let name = cmd.name();
        // SPEC §11.11: an SDK never attests on its own inference. A worker
        // releases `not_committed` only on the remote's definitive refusal
        // of that fence's write (the simulated hook's `not_committed`
        // continues as `execute` and is checked by `no-guess`).
        if let Command::Release(r) = &cmd
            && r.reason == settle_core::ReleaseReason::NotCommitted
            && !self.workers[w].refused.contains(&r.fence)
        {
            self.check.fail(
                Some(key),
                "attested-by-inference",
                format!(
                    "w{w} released fence {} as not_committed without the remote's refusal",
                    r.fence.0
                ),
            );
        }
        let poisoned_before = self.store.is_poisoned();
        // The lease a claim may be answered again (rule 5a): a grant of
        // that fence is not a new one.
        let open_before = match &cmd {
            Command::Claim(_) => match self.store.get(&self.tenant, &self.keys[key]) {
                Ok(Ok(Some(r))) => r.open_lease().map(|l| (l.fence, l.claim_id.clone())),
                _ => None,
            },
            _ => None,
        };
        let Ok(res) = self.store.execute(&self.tenant, cmd.clone()) else {
            self.log(Some(key), format!("w{w} {name} lost: the store is down"));
            return;
        };
        let reply = match res {
            Ok(r) => Ok(r),
            Err(LedgerError::Store(e)) => Err(e.to_string()),
            Err(e) => {
                self.check.fail(
                    Some(key),
                    "valid-requests",
                    format!("{name} was refused as invalid: {e}"),
                );
                return;
            }
        };
        self.log(Some(key), format!("w{w} {name} -> {}", describe(&reply)));
        if poisoned_before && reply.is_ok() {
            let detail = format!("{name} answered by a store that failed closed");
            self.check.fail(Some(key), "fail-closed", detail);
        }
        self.on_ledger_answer(w, call, &cmd, &reply, open_before);
        self.after_store_call();
        self.observe(key);
        self.send(Ev::FromLedger { w, call, reply }, key, "the answer");
    }

    /// Checks what the ledger answered (before the network sees it).
    fn on_ledger_answer(
        &mut self,
        w: usize,
        call: u64,
        cmd: &Command,
        reply: &Result<Reply, String>,
        open_before: Option<(settle_core::Fence, Option<settle_core::ClaimId>)>,
    ) {
        let (key, fp) = (self.workers[w].key, self.workers[w].spec.fingerprint);
        // A hook that cannot tell never resolves a record: a committed or
        // not_committed finding accepted on such a key is a guess.
        if let Command::Reconcile(rc) = cmd
            && self.opaque[key]
            && !matches!(rc.finding, settle_core::Finding::Unavailable)
            && matches!(reply, Ok(Reply::Receipt(_) | Reply::Claim(_)))
        {
            self.check.fail(
                Some(key),
                "no-guess",
                format!("w{w}'s reconcile finding was accepted, but the key's hook cannot tell"),
            );
        }
        match reply {
            Ok(Reply::Claim(d)) if let Command::Claim(c) = cmd => {
                match (d.grant(), &open_before) {
                    // Rule 5a: the live lease granted to this very claim
                    // (its first answer was lost, or was a 503 whose write
                    // survived), answered again: not a new grant.
                    (Some(g), Some((fence, id))) if g.fence == *fence => {
                        if id.is_none() || *id != c.claim_id {
                            self.check.fail(
                                Some(key),
                                "protocol",
                                format!("w{w}'s claim was granted another claim's live lease"),
                            );
                        }
                    }
                    _ => self.check.on_grant(key, d),
                }
                if let Some(g) = d.grant() {
                    self.granted.insert((w, call), g.fence);
                }
                self.own_lease_in_flight(w, call, d);
                if let settle_core::ClaimDecision::Replay { outcome, receipt } = d {
                    self.check
                        .on_replay(key, &fp, outcome.response_sha256(), receipt);
                    self.result_owner(w);
                }
            }
            Ok(Reply::Receipt(rc)) => {
                self.check.on_receipt(key, &fp, rc);
                self.result_owner(w);
            }
            _ => {}
        }
    }

    /// SPEC §11.11, a lost claim answer: the retried claim carries the
    /// same `claim_id` and gets the same grant while the lease lives; it
    /// must never meet that very lease as `in_flight` (the worker would
    /// wait on a lease it holds, and without `marks_dispatch` the lapse
    /// leaves the key `unknown` although nothing was sent).
    fn own_lease_in_flight(&mut self, w: usize, call: u64, d: &settle_core::ClaimDecision) {
        if !matches!(d, settle_core::ClaimDecision::InFlight { .. }) {
            return;
        }
        let Some(&mine) = self.granted.get(&(w, call)) else {
            return;
        };
        let key = self.workers[w].key;
        if let Ok(Ok(Some(r))) = self.store.get(&self.tenant, &self.keys[key])
            && r.open_lease().is_some_and(|l| l.fence == mine)
        {
            self.check.fail(
                Some(key),
                "own-lease-in-flight",
                format!(
                    "w{w}'s retried claim met its own lease (fence {}) as in_flight",
                    mine.0
                ),
            );
        }
    }

    fn result_owner(&mut self, w: usize) {
        let key = self.workers[w].key;
        if let Ok(Ok(Some(r))) = self.store.get(&self.tenant, &self.keys[key]) {
            let spec = self.workers[w].spec.clone();
            self.check
                .result_owner(key, &r, &spec.fingerprint, &spec.binding(spec.generation));
        }
    }

    /// After any store call: a power cut or a failed sync takes the process down.
    fn after_store_call(&mut self) {
        if self.store.power_lost() {
            let mode = self.crash_mode();
            self.log(
                None,
                format!("power lost during a sync ({mode:?}); the store is down"),
            );
            self.store.crash(mode);
            let d = self.between(100, 3_000);
            self.at(self.now + d, Ev::Restart);
        } else if self.store.is_poisoned() {
            self.log(None, "the store failed closed; the supervisor restarts it");
            self.tally.fault("fail_closed_restart");
            if let Some(Ok(())) = self.store.health() {
                self.check
                    .fail(None, "fail-closed", "a poisoned store reports ready");
            }
            self.store.stop();
            let d = self.between(50, 1_000);
            self.at(self.now + d, Ev::Restart);
        }
    }

    fn crash_mode(&mut self) -> Crash {
        match self.rng.below(3) {
            0 => Crash::Drop,
            1 => Crash::Keep,
            _ => Crash::Tear(self.rng.next_u64()),
        }
    }

    /// Checks the record of `key` as the ledger shows it now.
    pub fn observe(&mut self, key: usize) {
        match self.store.get(&self.tenant, &self.keys[key]) {
            Ok(Ok(r)) => {
                self.check.record(key, r.as_ref());
                if let Some(r) = r {
                    self.unreported_effect(key, &r);
                }
            }
            // The embedded store's clock floor lives in memory only: after
            // a restart behind a backward jump, a record settled later than
            // the clock now reads is refused (SPEC §6.9, fail closed) until
            // the clock catches up. Anywhere else a refusal is a violation.
            Ok(Err(code))
                if code == settle_core::RefusalCode::RecordRefused && self.restarted_behind =>
            {
                self.tally.fault("refused_after_restart_behind_clock");
                self.log(
                    Some(key),
                    "get answered record_refused (restarted behind the clock)",
                );
            }
            Ok(Err(code)) => self.check.fail(
                Some(key),
                "record-refused",
                format!("get answered {}", code.code()),
            ),
            Err(e) => self.log(Some(key), format!("get failed: {e}")),
        }
    }

    /// A write the remote applied must leave the record terminal,
    /// reconciling, or under a live lease: otherwise the next claim would
    /// be told to execute again.
    fn unreported_effect(&mut self, key: usize, r: &settle_core::Record) {
        let live = r.open_lease().is_some();
        if !r.status.is_terminal()
            && !r.reconcile_required
            && !live
            && !self.remote.applied(self.keys[key].as_str()).is_empty()
        {
            self.check.fail(
                Some(key),
                "unreported-effect",
                format!(
                    "the remote applied a write; the record is {:?} with no flag and no lease",
                    r.status
                ),
            );
        }
    }

    fn fault(&mut self, f: Fault) {
        self.log(None, format!("fault: {f:?}"));
        match f {
            Fault::Crash(mode) => {
                if !self.store.is_up() {
                    return;
                }
                self.tally.fault("crash");
                let before = self.store.wal_files();
                self.store.crash(mode);
                let after = self.store.wal_files();
                self.log(
                    None,
                    format!("log before the crash: [{before}], after: [{after}]"),
                );
                let d = self.between(100, 3_000);
                self.at(self.now + d, Ev::Restart);
            }
            Fault::PowerCutDuringSync(n) => {
                self.tally.fault("power_cut_during_sync");
                self.store.cut_power_after(n);
            }
            Fault::FsyncError => {
                self.tally.fault("fsync_error");
                self.store.fail_next_sync();
            }
            Fault::IndexPersistError => {
                self.tally.fault("index_persist_error");
                self.store.fail_next_persist();
            }
            Fault::ClockForward(ms) => {
                self.tally.fault("clock_forward");
                self.clock_offset += ms as i64;
            }
            Fault::ClockBackward(ms) => {
                self.tally.fault("clock_backward");
                self.clock_offset -= ms as i64;
            }
            Fault::Revoke(p) => self.revoke(p),
        }
    }

    /// An operator revokes a principal, mid-effect for whoever holds a lease.
    fn revoke(&mut self, p: usize) {
        let principal = self.principals[p].0.clone();
        match self
            .store
            .execute(&self.tenant, Command::Revoke(Revoke { principal }))
        {
            Ok(Ok(Reply::Revoked { generation, .. })) => {
                self.tally.fault("revoke");
                self.principals[p].1 = generation;
                self.log(None, format!("svc-{p} revoked: generation {generation}"));
            }
            Ok(other) => self.log(None, format!("revoke of svc-{p} failed: {other:?}")),
            Err(_) => self.log(None, format!("revoke of svc-{p} lost: the store is down")),
        }
        self.after_store_call();
    }

    /// The supervisor restarts the store: recovery must succeed and lose
    /// nothing that was acknowledged.
    fn restart(&mut self) {
        if self.store.is_up() {
            return;
        }
        if self.store.power_lost() {
            // The power went during the last attempt's recovery.
            let mode = self.crash_mode();
            self.store.crash(mode);
        }
        if self.store_ms() < self.clock_high {
            // A restart forgets the time the store used before (see
            // `observe`): records settled since may now be refused.
            self.restarted_behind = true;
        }
        match self.store.open() {
            Ok(()) => {
                self.restart_failures = 0;
                let files = self.store.wal_files();
                self.log(
                    None,
                    format!("the store restarted (recovery ran): log [{files}]"),
                );
                for k in 0..self.keys.len() {
                    if self.check.touched(k) {
                        self.observe(k);
                    }
                }
            }
            // A transient I/O error (an injected fault still armed) fails
            // the open closed; the supervisor tries again. Anything else
            // (corruption, a refused log) is a violation.
            Err(StoreError::Io(e)) if self.restart_failures < 3 => {
                self.restart_failures += 1;
                self.tally.fault("restart_failed");
                self.log(None, format!("the store does not reopen yet: {e}"));
                let d = self.between(100, 1_000);
                self.at(self.now + d, Ev::Restart);
            }
            Err(e) => self
                .check
                .fail(None, "recovery", format!("the store does not reopen: {e}")),
        }
    }

    /// A write or query reaches the remote.
    fn remote_call(&mut self, w: usize, call: u64, op: RemoteOp) {
        let key = self.workers[w].key;
        let name = self.keys[key].as_str().to_string();
        let res = match op {
            RemoteOp::Write(fence) => {
                let refuse = self.chance(self.knobs.refuse);
                let r = self.remote.write(&name, key, fence, self.now, refuse);
                if let WriteResult::Applied(_) = r {
                    self.check_remote(key);
                }
                RemoteRes::Write(r)
            }
            RemoteOp::Query(_) if self.opaque[key] => {
                self.tally.fault("hook_cannot_tell");
                RemoteRes::Query(QueryResult::CannotTell)
            }
            RemoteOp::Query(fence) => {
                if self.chance(self.knobs.unavailable) {
                    self.tally.fault("reconcile_unavailable");
                    self.log(
                        Some(key),
                        format!("w{w} query under fence {} cannot reach the remote", fence.0),
                    );
                    return;
                }
                RemoteRes::Query(self.remote.query(&name, key, fence))
            }
        };
        self.log(Some(key), format!("remote: w{w} {op:?} -> {res:?}"));
        if matches!(res, RemoteRes::Write(WriteResult::Applied(_)))
            && self.chance(self.knobs.apply_then_timeout)
        {
            self.tally.fault("remote_applied_then_timed_out");
            self.log(Some(key), "remote applied, then its answer timed out");
            return;
        }
        self.send(Ev::FromRemote { w, call, res }, key, "the remote's answer");
    }

    /// The remote's checkers: at most one applied write per key, fences
    /// increasing.
    fn check_remote(&mut self, key: usize) {
        let name = self.keys[key].as_str();
        let applied = self.remote.applied(name).to_vec();
        if applied.len() > 1 {
            let fences: Vec<u64> = applied.iter().map(|a| a.fence.0).collect();
            self.check.fail(
                Some(key),
                "at-most-once",
                format!(
                    "the remote applied {} writes (fences {fences:?})",
                    applied.len()
                ),
            );
        }
        let seen = self.remote.seen(name);
        if seen.windows(2).any(|w| w[1] < w[0]) {
            self.check
                .fail(Some(key), "remote-fences-increase", format!("{seen:?}"));
        }
    }

    /// The worker's spec for principal `p` at its current generation.
    pub fn generation(&self, p: usize) -> u64 {
        self.principals[p].1
    }

    /// The store's clock, ms.
    pub fn store_ms(&self) -> u64 {
        self.clock_ms.load(Ordering::SeqCst)
    }

    /// The reconciler (SPEC §11.10): for each record that requires
    /// reconciliation and has no reconciler at work, a reconciler worker
    /// that claims with the stored reservation, the principal's current
    /// generation and `marks_dispatch`, asks the key's hook (the remote's
    /// status API) and reports the finding; it never runs the effect.
    pub fn reconciler_sweep(&mut self) {
        for key in 0..self.keys.len() {
            let busy = self
                .workers
                .iter()
                .any(|w| w.key == key && w.spec.reconciler && w.done.is_none());
            if busy {
                continue;
            }
            let Ok(Ok(Some(r))) = self.store.get(&self.tenant, &self.keys[key]) else {
                continue;
            };
            if !r.reconcile_required {
                continue;
            }
            if let Some(spec) = self.spec_from(key, &r, true) {
                self.log(Some(key), "the reconciler picks it up");
                self.tally.fault("reconciler_claim");
                self.add_worker(spec);
            }
        }
    }

    /// A worker for `key` acting on the record's reservation at the
    /// principal's current generation, starting now (a reconciler, or a
    /// caller retrying its request).
    pub fn spec_from(
        &self,
        key: usize,
        r: &settle_core::Record,
        reconciler: bool,
    ) -> Option<WorkerSpec> {
        let res = &r.reservation;
        let principal = self
            .principals
            .iter()
            .position(|(p, _)| *p == res.principal)?;
        let marks_dispatch = reconciler
            || self
                .workers
                .iter()
                .find(|w| w.key == key && !w.spec.reconciler)
                .is_some_and(|w| w.spec.marks_dispatch);
        Some(WorkerSpec {
            key,
            principal,
            principal_name: res.principal.clone(),
            scopes: res.scopes.clone(),
            fingerprint: res.fingerprint,
            // The principal's current generation as the store has it (what
            // a reconciler reads with GET /v1/principals/{p}).
            generation: self
                .store
                .generation(&self.tenant, &res.principal)
                .unwrap_or(0)
                .max(self.generation(principal))
                .max(res.generation),
            marks_dispatch,
            lease_ms: 1_000,
            start: self.now,
            deadline: self.now + HORIZON_MS / 2,
            reconciler,
        })
    }

    /// Adds a worker and schedules its first step.
    pub fn add_worker(&mut self, spec: WorkerSpec) {
        let w = self.workers.len();
        let start = spec.start;
        self.workers.push(Worker::new(w, spec));
        self.at(start, Ev::Wake { w, epoch: 0 });
    }
}

/// A short description of an answer, for the history.
pub fn describe(r: &Result<Reply, String>) -> String {
    match r {
        Ok(Reply::Claim(d)) => match d {
            settle_core::ClaimDecision::Execute(g) => format!("execute fence {}", g.fence.0),
            settle_core::ClaimDecision::Reconcile(g) => format!("reconcile fence {}", g.fence.0),
            settle_core::ClaimDecision::InFlight { retry_after_ms, .. } => {
                format!("in_flight {retry_after_ms} ms")
            }
            settle_core::ClaimDecision::Replay { receipt, .. } => {
                format!(
                    "replay {} fence {}",
                    receipt.status.as_str(),
                    receipt.fence.0
                )
            }
        },
        Ok(Reply::Receipt(rc)) => format!("receipt {} fence {}", rc.status.as_str(), rc.fence.0),
        Ok(Reply::Refused(c)) => format!("refused {}", c.code()),
        Ok(Reply::Released { fence }) => format!("released fence {}", fence.0),
        Ok(Reply::Heartbeat(l)) | Ok(Reply::Dispatched(l)) => {
            format!("ok, lease to {}", l.lease_expires_at.0)
        }
        Ok(other) => other.label().to_string(),
        Err(e) => format!("503 ({e})"),
    }
}
