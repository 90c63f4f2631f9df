//! PostgreSQL restarts under load. This restarts the local cluster, so it is
//! the only test in its binary (cargo runs test binaries one at a time) and
//! it always leaves the cluster running.

mod common;

use std::process::Command as Proc;
use std::time::{Duration, Instant};

use settle_core::testkit::*;
use settle_core::*;
use settle_ledger::Store;
use settle_pg::PgStore;

struct Cluster {
    version: String,
}

impl Cluster {
    /// The local Debian cluster, as `.ci/run` starts it.
    fn local() -> Option<Cluster> {
        let version = std::fs::read_dir("/etc/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().to_string())
            .min()?;
        Proc::new("pg_ctlcluster").arg("--help").output().ok()?;
        Some(Cluster { version })
    }
    fn ctl(&self, action: &str) -> bool {
        Proc::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &self.version, "main", action])
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
    fn accepting(&self) -> bool {
        Proc::new("pg_isready")
            .args(["-h", "127.0.0.1", "-p", "5432"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }
}

/// Whatever happens in the test, PostgreSQL is running afterwards.
struct EnsureRunning<'a>(&'a Cluster);

impl Drop for EnsureRunning<'_> {
    fn drop(&mut self) {
        if !self.0.accepting() {
            self.0.ctl("start");
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.0.accepting() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn acme() -> TenantId {
    TenantId::new("acme").unwrap()
}

async fn pair(store: &PgStore, k: &str) -> Result<Receipt, String> {
    let f = match store
        .execute(&acme(), claim(k, 1, binding("alice", 0)))
        .await
        .map_err(|e| e.to_string())?
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => return Err(format!("{other:?}")),
    };
    match store
        .execute(&acme(), settle(k, f, 1, binding("alice", 0), completed(1)))
        .await
        .map_err(|e| e.to_string())?
    {
        Reply::Receipt(rc) => Ok(rc),
        other => Err(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_recovers_after_postgres_restarts_and_no_receipt_is_lost() {
    let url = common::url();
    let Some(cluster) = Cluster::local().filter(|_| url.contains("127.0.0.1:5432")) else {
        eprintln!("skipped: no local pg_ctlcluster cluster behind {url}");
        return;
    };
    let _running = EnsureRunning(&cluster);
    let (store, _clock, _g) = common::store("restart").await;

    let before = match store
        .execute(&acme(), claim("held", 1, binding("alice", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{other:?}"),
    };

    // Pairs keep running through the restart; every receipt they get must
    // be in the database afterwards. Errors are allowed, wrong answers not.
    let back = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let store = store.clone();
        let back = back.clone();
        tokio::spawn(async move {
            let mut results = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut ok_since_back = 0;
            let mut i = 0;
            // Stop once 20 pairs in a row succeeded after PostgreSQL was back.
            while ok_since_back < 20 && Instant::now() < deadline {
                let k = format!("load-{i}");
                i += 1;
                let r = pair(&store, &k).await;
                if back.load(std::sync::atomic::Ordering::SeqCst) {
                    ok_since_back = if r.is_ok() { ok_since_back + 1 } else { 0 };
                }
                results.push((k, r));
            }
            results
        })
    };

    let restarted = tokio::task::spawn_blocking({
        let v = cluster.version.clone();
        move || Cluster { version: v }.ctl("restart")
    })
    .await
    .unwrap();
    assert!(restarted, "pg_ctlcluster restart failed");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cluster.accepting() {
        assert!(Instant::now() < deadline, "PostgreSQL did not come back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    back.store(true, std::sync::atomic::Ordering::SeqCst);

    let results = load.await.unwrap();
    let errors = results.iter().filter(|(_, r)| r.is_err()).count();
    let tail_ok = results.iter().rev().take_while(|(_, r)| r.is_ok()).count();
    eprintln!(
        "{} pairs during the restart, {errors} failed, {tail_ok} in a row succeeded at the end",
        results.len()
    );
    assert!(
        tail_ok >= 20,
        "the pool did not recover: {:?}",
        results.last()
    );

    for (k, r) in &results {
        if let Ok(rc) = r {
            let rec = store
                .get(&acme(), &key(k))
                .await
                .unwrap()
                .unwrap()
                .expect("a receipt was returned, so the record was committed");
            assert_eq!(rec.receipt.as_ref(), Some(rc), "{k}");
        }
    }
    // The lease taken before the restart survived it, and fences went on increasing.
    let rc = receipt(
        store
            .execute(
                &acme(),
                settle("held", before, 1, binding("alice", 0), completed(1)),
            )
            .await
            .unwrap(),
    );
    assert_eq!(rc.fence, before);
    let after = match store
        .execute(&acme(), claim("after", 1, binding("alice", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{other:?}"),
    };
    let highest = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok().map(|rc| rc.fence))
        .max()
        .unwrap_or(before);
    assert!(after > highest && after > before);
}
