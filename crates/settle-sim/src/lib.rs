//! # settle-sim: a seeded, deterministic simulator of the whole protocol
//!
//! One seed is one run: a few keys, several workers per key (duplicates,
//! retries, an occasional caller with another request or binding) running
//! SPEC §11's client against the real [`settle_ledger::Ledger`] over the
//! in-memory store or over the embedded engine's real log, checkpoint and
//! recovery code on a simulated disk ([`disk`]). Between
//! them a network that delays, drops, duplicates and reorders; behind the
//! workers a remote that honours key and fence. Faults: zombie pauses,
//! lost acknowledgements, crashes that drop or tear unsynced writes, power
//! cuts during a sync, fsync and checkpoint errors, clock jumps both ways,
//! revocations mid-effect, every reconcile finding, and a remote that
//! applies and then times out. Checkers run after every step, after every
//! restart and at the end (see [`check`] and `docs/testing.md`).
//!
//! Everything is a function of the seed: one RNG, a virtual clock, no
//! threads, no real time. `settle sim --seed S` replays a seed.

pub mod check;
pub mod disk;
pub mod remote;
pub mod store;
pub mod worker;
pub mod world;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use settle_core::{Digest, LeaseMs, Scopes, Status};

pub use crate::check::Violation;
pub use crate::store::EngineKind;
use crate::worker::WorkerSpec;
use crate::world::{HORIZON_MS, STUCK_AFTER_MS, World};

/// What one seed did.
#[derive(Clone, Debug)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// The engine it ran against.
    pub engine: EngineKind,
    /// Events processed.
    pub steps: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// The first violation found (a run stops at it).
    pub violation: Option<Violation>,
    /// The failing key's trimmed history (its own events and the global
    /// faults), when a violation was found.
    pub history: Vec<String>,
}

/// The engine a seed runs against when none is forced: one in four on
/// the in-memory store, the rest on the embedded engine.
pub fn engine_for(seed: u64) -> EngineKind {
    if seed % 4 == 3 {
        EngineKind::Memory
    } else {
        EngineKind::Embedded
    }
}

/// Runs one seed (on `engine`, or the seed's default).
pub fn run_seed(seed: u64, engine: Option<EngineKind>) -> SeedReport {
    run_seed_with(seed, engine, true)
}

/// Runs one seed; `reconciler` false: the world as it was before the
/// reconciler (regression seeds of that time).
pub fn run_seed_with(seed: u64, engine: Option<EngineKind>, reconciler: bool) -> SeedReport {
    let engine = engine.unwrap_or_else(|| engine_for(seed));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut w = World::with(seed, engine, reconciler);
        plan_workers(&mut w);
        w.plan_faults();
        w.run();
        if w.check.violations.is_empty() {
            finish(&mut w);
        }
        w
    }));
    match outcome {
        Ok(w) => report(seed, engine, w),
        Err(panic) => {
            let msg = settle_ledger::panic_message(panic.as_ref());
            SeedReport {
                seed,
                engine,
                steps: 0,
                faults: BTreeMap::new(),
                violation: Some(Violation {
                    key: None,
                    check: "panic",
                    detail: msg,
                }),
                history: Vec::new(),
            }
        }
    }
}

fn report(seed: u64, engine: EngineKind, w: World) -> SeedReport {
    let violation = w.check.violations.first().cloned();
    let history = match &violation {
        Some(v) => trimmed_history(&w, v.key),
        None => Vec::new(),
    };
    SeedReport {
        seed,
        engine,
        steps: w.tally.steps,
        faults: w.tally.faults,
        violation,
        history,
    }
}

/// The failing key's events and the global ones (crashes, clock jumps,
/// revocations), newest 200.
fn trimmed_history(w: &World, key: Option<usize>) -> Vec<String> {
    let lines: Vec<String> = w
        .history
        .iter()
        .filter(|l| l.key.is_none() || key.is_none() || l.key == key)
        .map(|l| {
            let mut s = String::new();
            let _ = write!(s, "{:>7} ms  ", l.at);
            if let Some(k) = l.key {
                let _ = write!(s, "{}  ", w.keys[k]);
            }
            s.push_str(&l.text);
            s
        })
        .collect();
    lines[lines.len().saturating_sub(200)..].to_vec()
}

/// Several workers per key: duplicates and retries of the same request,
/// now and then a caller with another request (fingerprint) or principal.
fn plan_workers(w: &mut World) {
    const LEASES: [u64; 4] = [300, 1_000, 2_500, 5_000];
    for key in 0..w.keys.len() {
        let marks_dispatch = w.chance(500);
        let n = 1 + w.rng.below(4);
        for i in 0..n {
            let mut principal = key % w.principals.len();
            let mut scopes = Scopes::from_strs(["pay"]).expect("valid");
            let mut fingerprint = Digest([key as u8 + 1; 32]);
            match w.rng.below(100) {
                0..=5 => fingerprint = Digest([key as u8 + 101; 32]),
                6..=8 => {
                    if w.principals.len() > 1 {
                        principal = (principal + 1) % w.principals.len();
                    } else {
                        scopes = Scopes::from_strs(["refund"]).expect("valid");
                    }
                }
                _ => {}
            }
            let lease_ms = LEASES[w.rng.below(4) as usize];
            debug_assert!(LeaseMs::new(lease_ms).is_ok());
            let start = if i == 0 {
                w.between(0, 2_000)
            } else {
                w.between(0, 20_000)
            };
            // One caller in five gives up early (a short deadline): it
            // leaves claims, dispatches and settles unanswered at its
            // deadline, as SPEC §11.11's rows "until the deadline" say.
            let deadline = if w.side_chance(200) {
                start + w.side_between(500, 6_000)
            } else {
                start + HORIZON_MS / 2
            };
            let spec = WorkerSpec {
                key,
                principal,
                principal_name: w.principals[principal].0.clone(),
                scopes,
                fingerprint,
                generation: w.generation(principal),
                marks_dispatch,
                lease_ms,
                start,
                deadline,
                reconciler: false,
            };
            w.add_worker(spec);
        }
    }
}

/// Steps the liveness phase may take at most (a bound, not a timeout:
/// without faults a key needs a few dozen).
const LIVENESS_STEPS: u64 = 20_000;

/// SPEC §11.10, liveness: once faults stop, the reconciler resolves every
/// record whose hook can tell, and each caller retries its request once;
/// within a bounded number of steps every such key is terminal. (That no
/// key whose hook cannot tell is settled by a guess is checked on every
/// answer: `no-guess`.)
fn liveness(w: &mut World) {
    w.knobs = world::Knobs::default();
    w.store.disarm();
    w.horizon = w.now + world::HORIZON_MS;
    let first = w.tally.steps;
    if !w.store.is_up() {
        w.at(w.now, world::Ev::Restart);
        w.run();
    }
    w.at(w.now, world::Ev::ReconcilerSweep);
    w.run();
    for k in 0..w.keys.len() {
        let spec = match w.store.get(&w.tenant, &w.keys[k]) {
            Ok(Ok(Some(r))) => w.spec_from(k, &r, false),
            _ => None,
        };
        let spec = spec.or_else(|| {
            let mut s = w.workers.iter().find(|x| x.key == k)?.spec.clone();
            s.generation = w.generation(s.principal);
            (s.start, s.deadline) = (w.now, w.now + world::HORIZON_MS / 2);
            Some(s)
        });
        if let Some(s) = spec {
            w.log(Some(k), "the caller retries (liveness)");
            w.add_worker(s);
        }
    }
    w.horizon = w.now + world::HORIZON_MS;
    w.run();
    w.horizon = w.now + world::HORIZON_MS;
    w.at(w.now, world::Ev::ReconcilerSweep);
    w.run();
    if !w.check.violations.is_empty() {
        return;
    }
    let used = w.tally.steps - first;
    if used > LIVENESS_STEPS {
        w.check
            .fail(None, "liveness", format!("{used} steps without faults"));
    }
    for k in 0..w.keys.len() {
        w.observe(k);
        let Some(r) = w.check.last(k).cloned() else {
            continue;
        };
        if !w.opaque[k] && !r.status.is_terminal() {
            w.check.fail(
                Some(k),
                "liveness",
                format!(
                    "{:?} (reconcile_required {}) after the reconciler and a retry without faults",
                    r.status, r.reconcile_required
                ),
            );
        }
    }
}

/// The end of a run: restart a store that is down, check every key once
/// more, then that no key is left without a way forward and unreported,
/// then liveness.
fn finish(w: &mut World) {
    if !w.store.is_up() {
        w.at(w.now, world::Ev::Restart);
        w.run();
    }
    for k in 0..w.keys.len() {
        w.observe(k);
    }
    // Far past every lease and the stuck threshold: every open record is
    // then either reconciling or on the stuck list.
    w.clock_offset += (STUCK_AFTER_MS + 3_600_000) as i64;
    w.at(w.now, world::Ev::Sweep);
    w.run();
    let Some(now) = w.store.now() else { return };
    let mut expect_stuck = 0;
    let mut expect_flagged = 0;
    for k in 0..w.keys.len() {
        w.observe(k);
        let Some(r) = w.check.last(k).cloned() else {
            continue;
        };
        if r.status.is_terminal() {
            continue;
        }
        if r.reconcile_required {
            expect_flagged += 1;
        }
        let live = r.open_lease().is_some_and(|l| l.expires_at > now);
        if !live && now.ms_since(r.updated_at) >= STUCK_AFTER_MS {
            expect_stuck += 1;
        } else if !live && !r.reconcile_required {
            w.check.fail(
                Some(k),
                "way-forward",
                format!("{:?} record neither stuck nor reconciling", r.status),
            );
        }
        if matches!(r.status, Status::Pending | Status::Conflict)
            && !r.reconcile_required
            && !w.remote.applied(r.key.as_str()).is_empty()
        {
            w.check.fail(
                Some(k),
                "unreported-effect",
                "the remote applied a write; the ledger would execute again",
            );
        }
    }
    match w.store.stats(STUCK_AFTER_MS) {
        Some(Ok(s)) if s.stuck != expect_stuck || s.reconcile_required != expect_flagged => {
            let detail = format!(
                "stats report {} stuck and {} reconciling, the records say {expect_stuck} and {expect_flagged}",
                s.stuck, s.reconcile_required
            );
            w.check.fail(None, "stuck-list", detail);
        }
        Some(Err(e)) => w
            .check
            .fail(None, "stuck-list", format!("stats failed: {e}")),
        _ => {}
    }
    if w.check.violations.is_empty() {
        liveness(w);
    }
}

/// Totals over many seeds.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub seeds: u64,
    /// Events processed.
    pub steps: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Seeds that found a violation.
    pub violations: u64,
    /// The failing seeds (the first few).
    pub failing: Vec<SeedReport>,
}

impl Summary {
    /// Adds one seed's report.
    pub fn add(&mut self, r: SeedReport) {
        self.seeds += 1;
        self.steps += r.steps;
        for (k, n) in &r.faults {
            *self.faults.entry(k).or_default() += n;
        }
        if r.violation.is_some() {
            self.violations += 1;
            if self.failing.len() < 10 {
                self.failing.push(r);
            }
        }
    }

    /// `{"seeds": n, "steps": n, "faults": {kind: n}, "violations": n}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "seeds": self.seeds,
            "steps": self.steps,
            "faults": self.faults,
            "violations": self.violations,
        })
    }
}

/// Runs seeds `first..first + n`.
pub fn run_seeds(first: u64, n: u64, engine: Option<EngineKind>) -> Summary {
    let mut s = Summary::default();
    for seed in first..first + n {
        s.add(run_seed(seed, engine));
    }
    s
}
