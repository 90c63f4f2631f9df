//! SIGKILL crash test: a child process (`settle-embedded-torture`) runs the
//! crash harness's load (`settle_ledger::crash`: concurrent claim/settle
//! traffic) and is killed at a random moment; the store is reopened and
//! every grant and receipt the child reported is checked by the harness.
//!
//! `SETTLE_CRASH_ITERATIONS` sets the number of kills (default 100; the
//! long run uses 1000).

use std::io::{BufRead, BufReader};
use std::process::{Command as Proc, Stdio};

use settle_core::invariants::check_record;
use settle_core::*;
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::crash::{Acked, Workload};

/// A small deterministic generator (xorshift) so a failure is reproducible from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Runs the child on `dir` with keys `{prefix}-…`, records what it
/// acknowledged into `acked`, and kills it (SIGKILL) after `kill_after`
/// receipts; returns how many receipts it acknowledged.
fn run_child_until_killed(
    dir: &std::path::Path,
    prefix: &str,
    kill_after: usize,
    acked: &Acked,
) -> usize {
    let mut child = Proc::new(env!("CARGO_BIN_EXE_settle-embedded-torture"))
        .args([dir.to_str().unwrap(), prefix, "32"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    // The child keeps going until the kill lands; everything it printed
    // before was acknowledged.
    let mut seen = 0usize;
    let mut killed = false;
    while let Some(Ok(line)) = lines.next() {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if let (Some(k), Some(f)) = (v.get("grant"), v.get("fence")) {
            acked.grant(k.as_str().unwrap(), Fence(f.as_u64().unwrap()));
        }
        if let Some(k) = v.get("ack") {
            let rc: Receipt = serde_json::from_value(v["receipt"].clone()).unwrap();
            assert_eq!(k.as_str(), Some(rc.key.as_str()), "{line}");
            acked.receipt(rc);
            seen += 1;
        }
        if !killed && seen >= kill_after {
            child.kill().unwrap(); // SIGKILL
            killed = true;
        }
    }
    let status = child.wait().unwrap();
    assert!(
        killed,
        "{prefix}: the child ended by itself ({status}) after {seen} receipts"
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_acknowledged_receipt() {
    let iterations: u64 = std::env::var("SETTLE_CRASH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let seed: u64 = std::env::var("SETTLE_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234);
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    // The child's tenant and principal (`settle-embedded-torture`): the
    // probes claim under them too.
    let workload = Workload::new(TenantId::new("crash").unwrap(), "worker", "probe", 1);
    // Everything ever acknowledged, across all iterations.
    let acked = Acked::new();
    let mut total_acks = 0usize;
    let mut open_leases = 0usize;

    for it in 0..iterations {
        // Kill after a random number of acknowledgements (the child keeps going meanwhile).
        let kill_after = 1 + (rng.next() % 1500) as usize;
        total_acks += run_child_until_killed(dir.path(), &format!("i{it}"), kill_after, &acked);

        // Reopen and check this run's acknowledgements, a sample of the
        // earlier ones, and everything on the last iteration.
        let last = it + 1 == iterations;
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let this_run = format!("i{it}-");
        // About 512 earlier acknowledgements per kill, so long runs stay linear.
        let sample = acked.leases() as u64 / 512 + 1;
        let what = format!("iteration {it}");
        let verified = acked
            .verify_where(&*store, &workload.tenant, &what, |k| {
                last || k.starts_with(&this_run) || rng.next().is_multiple_of(sample)
            })
            .await;
        open_leases += verified.grants;
        // Fences keep increasing after the restart.
        acked
            .fences_go_on(&*store, &workload, &format!("probe-{it}"), &what)
            .await;
        store.close();
        drop(store);
        // No record violates SPEC §6 (a full scan every tenth kill, every
        // hundredth in long runs, and at the end).
        if it % 10 == 9 && (iterations <= 100 || it % 100 == 99) || last {
            settle_embedded::scan(dir.path(), |_, r| {
                if let Err(v) = check_record(r) {
                    panic!("iteration {it}: {v} in {r:?}");
                }
            })
            .unwrap();
        }
    }
    eprintln!(
        "crash test: {iterations} SIGKILLs, {total_acks} acknowledgements checked, {} distinct receipts, \
         {open_leases} checks of leases acknowledged without a receipt",
        acked.receipts()
    );
    assert!(total_acks >= iterations as usize);
}
