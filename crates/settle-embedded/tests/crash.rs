//! SIGKILL crash test: a child process runs concurrent claim/settle traffic
//! and is killed at a random moment; the store is reopened and checked.
//!
//! `SETTLE_CRASH_ITERATIONS` sets the number of kills (default 100; the
//! long run uses 1000).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command as Proc, Stdio};

use settle_core::invariants::check_record;
use settle_core::testkit::*;
use settle_core::*;
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::Store;

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
    let tenant = TenantId::new("crash").unwrap();
    // Everything ever acknowledged, across all iterations: the receipt per (key, fence).
    let mut acked: HashMap<(String, u64), Receipt> = HashMap::new();
    let mut max_granted = 0u64;
    let mut total_acks = 0usize;

    for it in 0..iterations {
        let mut child = Proc::new(env!("CARGO_BIN_EXE_settle-embedded-torture"))
            .args([dir.path().to_str().unwrap(), &format!("i{it}"), "32"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        // Kill after a random number of acknowledgements (the child keeps going meanwhile).
        let kill_after = 1 + (rng.next() % 1500) as usize;
        let mut seen = 0usize;
        let mut killed = false;
        while let Some(Ok(line)) = lines.next() {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if let Some(f) = v.get("fence") {
                max_granted = max_granted.max(f.as_u64().unwrap());
            }
            if let Some(k) = v.get("ack") {
                let rc: Receipt = serde_json::from_value(v["receipt"].clone()).unwrap();
                max_granted = max_granted.max(rc.fence.0);
                acked.insert((k.as_str().unwrap().to_string(), rc.fence.0), rc);
                seen += 1;
            }
            if !killed && seen >= kill_after {
                child.kill().unwrap(); // SIGKILL
                killed = true;
            }
        }
        if !killed {
            child.kill().ok();
        }
        child.wait().unwrap();
        total_acks += seen;

        // Reopen and check this run's acknowledgements, a sample of the
        // earlier ones, and everything on the last iteration.
        let last = it + 1 == iterations;
        let store = EmbeddedStore::open(dir.path(), EmbeddedOptions::default()).unwrap();
        let this_run = format!("i{it}-");
        // About 512 earlier acknowledgements per kill, so long runs stay linear.
        let acked_len = acked.len() as u64;
        for ((k, fence), rc) in acked.iter().filter(|((k, _), _)| {
            last || k.starts_with(&this_run) || rng.next().is_multiple_of(acked_len / 512 + 1)
        }) {
            let r = store
                .get(&tenant, &key(k))
                .await
                .unwrap()
                .unwrap()
                .unwrap_or_else(|| panic!("iteration {it}: acknowledged {k} is gone"));
            if rc.status.is_terminal() {
                assert_eq!(r.receipt.as_ref(), Some(rc), "iteration {it}: {k}");
            } else {
                let a = r.attempt_for(Fence(*fence)).expect("attempt kept");
                assert_eq!(a.receipt.as_ref(), Some(rc), "iteration {it}: {k}");
                assert!(r.status.rank() >= Status::Unknown.rank());
            }
        }
        // Fences keep increasing after the restart.
        let probe = format!("probe-{it}");
        match store
            .execute(&tenant, claim(&probe, 1, binding("worker", 0)))
            .await
            .unwrap()
        {
            Reply::Claim(ClaimDecision::Execute(g)) => {
                assert!(
                    g.fence.0 > max_granted,
                    "iteration {it}: fence {} reused",
                    g.fence.0
                );
                max_granted = g.fence.0;
            }
            other => panic!("{other:?}"),
        }
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
        "crash test: {iterations} SIGKILLs, {total_acks} acknowledgements checked, {} distinct receipts",
        acked.len()
    );
    assert!(total_acks >= iterations as usize);
}
