//! `settle backup` against a real `settle serve` (embedded, a tenant and
//! an admin token): the file it leaves verifies and holds what was written,
//! `--json` says what it holds, nothing is overwritten or left half
//! written, the exit codes are the client subcommands'; and a backup taken
//! while claims and settles go on holds every receipt acknowledged before
//! it started.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use serde_json::Value;
use settle_portable::{Entity, Reader};

const ADMIN: &str = "admin-secret";
const TENANT: &str = "tok-acme";

fn server(dir: &Path) -> Server {
    let tenant = format!("acme={}", token_sha256(TENANT));
    let admin = token_sha256(ADMIN);
    Server::start(
        &dir.join("data"),
        &["--tenant", &tenant, "--admin-token-sha256", &admin],
    )
}

/// `settle backup ARGS` with `SETTLE_TOKEN` set to `token` (unset: none).
async fn backup(args: &[&str], token: Option<&str>) -> Output {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("backup")
        .args(args)
        .env_remove("SETTLE_URL")
        .env_remove("SETTLE_TOKEN");
    if let Some(t) = token {
        cmd.env("SETTLE_TOKEN", t);
    }
    cmd.output().await.unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every record line of a backup with a receipt: `key` → the receipt's fence.
fn receipts(file: &Path) -> BTreeMap<String, u64> {
    let f = std::io::BufReader::new(std::fs::File::open(file).unwrap());
    let mut out = BTreeMap::new();
    for e in Reader::new(f).unwrap() {
        if let Entity::Record { tenant, record } = e.unwrap() {
            assert_eq!(tenant.as_str(), "acme");
            if let Some(r) = &record.receipt {
                out.insert(record.key.to_string(), r.fence.0);
            }
        }
    }
    out
}

/// Claims and settles `key`; the receipt's fence.
async fn settled(ep: &settle_client::Client, key: &str, n: u8) -> u64 {
    let b = binding("svc", 0);
    let fence = execute(ep, key, n, &b).await;
    let r = op(ep, key, "settle", settle_body(fence, n, &b, completed(n))).await;
    assert_eq!(r.status, 200, "{:?}", r.json());
    r.json()["receipt"]["fence"].as_u64().unwrap()
}

/// `--max-rate` at the backup's own size per second: the same records, and
/// at least a second (pacing: never faster than the rate, however fast the
/// machine; how much slower is not asserted).
async fn throttled_backup_is_paced_and_whole(
    dir: &Path,
    url: &str,
    bytes: u64,
    written: &BTreeMap<String, u64>,
) {
    let slow = dir.join("slow.settle");
    let out = backup(
        &[
            "--url",
            url,
            "--to",
            slow.to_str().unwrap(),
            "--token",
            ADMIN,
            "--max-rate",
            &bytes.to_string(),
            "--json",
        ],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let t: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(t["max_rate"], bytes);
    assert!(t["seconds"].as_f64().unwrap() >= 1.0, "{t}");
    assert_eq!(receipts(&slow), *written);
    let out = backup(&["--url", url, "--to", "x", "--max-rate", "1.5M"], None).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a rate"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn a_backup_verifies_and_says_what_it_holds() {
    let dir = TempDir::new("backup");
    let s = server(dir.path());
    let acme = s.ep_token(TENANT);
    let mut written = BTreeMap::new();
    for i in 0..25u8 {
        let key = format!("order-{i:02}");
        written.insert(key.clone(), settled(&acme, &key, i).await);
    }
    let file = dir.path().join("backup.settle");
    let f = file.to_str().unwrap();
    let url = s.url();

    let out = backup(
        &["--url", &url, "--to", f, "--token", ADMIN, "--json"],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "bytes",
            "engine",
            "fence_floor",
            "file",
            "max_fence",
            "max_rate",
            "principals",
            "records",
            "seconds",
            "sha256",
            "warning_tasks"
        ]
    );
    let summary =
        settle_portable::verify(std::io::BufReader::new(std::fs::File::open(&file).unwrap()))
            .unwrap();
    assert_eq!(v["file"], f);
    assert_eq!(v["engine"], "embedded");
    assert_eq!(v["records"], 25);
    assert_eq!(v["records"], summary.records);
    assert_eq!(v["principals"], summary.principals);
    assert_eq!(v["warning_tasks"], summary.warning_tasks);
    assert_eq!(v["max_fence"], summary.max_fence);
    assert_eq!(v["fence_floor"], summary.fence_floor);
    assert_eq!(v["bytes"], std::fs::metadata(&file).unwrap().len());
    assert_eq!(v["sha256"], summary.sha256.as_str());
    assert!(v["seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(v["max_rate"], Value::Null);
    assert_eq!(receipts(&file), written);

    throttled_backup_is_paced_and_whole(dir.path(), &url, v["bytes"].as_u64().unwrap(), &written)
        .await;
    assert!(!dir.path().join("backup.settle.partial").exists());

    // Never over an existing file: refused, named, left as it was.
    let before = std::fs::read(&file).unwrap();
    let out = backup(&["--url", &url, "--to", f], Some(ADMIN)).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(f), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read(&file).unwrap(), before);

    // The token from SETTLE_TOKEN; a sentence without --json.
    let other = dir.path().join("second.settle");
    let out = backup(
        &["--url", &url, "--to", other.to_str().unwrap()],
        Some(ADMIN),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(line.contains("25 records"), "{line}");
    assert!(line.contains("second.settle"), "{line}");
    assert_eq!(receipts(&other), written);
}

#[tokio::test]
async fn refused_and_failed_backups_leave_no_file() {
    let dir = TempDir::new("backup-refused");
    let s = server(dir.path());
    let file = dir.path().join("b.settle");
    let f = file.to_str().unwrap();
    let url = s.url();
    let partial = dir.path().join("b.settle.partial");

    // A tenant's token, or none: 401, exit 4.
    for token in [Some(TENANT), None] {
        let out = backup(&["--url", &url, "--to", f], token).await;
        assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("401 unauthorized"),
            "{}",
            text(&out.stderr)
        );
        assert!(!file.exists() && !partial.exists());
    }

    // Nobody listening: exit 3.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let out = backup(
        &["--url", &format!("http://{closed}"), "--to", f],
        Some(ADMIN),
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(!file.exists() && !partial.exists());

    // A bad URL is a usage error.
    let out = backup(&["--url", "ftp://x", "--to", f], Some(ADMIN)).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));

    // A partial file of another backup is not taken over.
    std::fs::write(&partial, b"someone else's").unwrap();
    let out = backup(&["--url", &url, "--to", f], Some(ADMIN)).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("b.settle.partial"));
    assert_eq!(std::fs::read(&partial).unwrap(), b"someone else's");
    assert!(!file.exists());
}

/// SPEC §12: every receipt acknowledged before the backup started is in
/// it, while claims and settles go on during the backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_under_load_holds_every_receipt_acknowledged_before_it() {
    let dir = TempDir::new("backup-load");
    let s = server(dir.path());
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..8 {
        let ep = s.ep_token(TENANT);
        let acked = acked.clone();
        let stop = stop.clone();
        workers.push(tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("w{w}-{i:06}");
                let fence = settled(&ep, &key, (i % 100) as u8).await;
                acked.lock().unwrap().push((key, fence));
                i += 1;
            }
            i
        }));
    }
    // Let the load build up, then back up while it runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while acked.lock().unwrap().len() < 2000 {
        assert!(
            workers.iter().all(|w| !w.is_finished()) && std::time::Instant::now() < deadline,
            "the load stopped before 2,000 pairs"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let before: Vec<(String, u64)> = acked.lock().unwrap().clone();
    let file = dir.path().join("live.settle");
    let out = backup(
        &["--url", &s.url(), "--to", file.to_str().unwrap(), "--json"],
        Some(ADMIN),
    )
    .await;
    let during = acked.lock().unwrap().len() - before.len();
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for w in workers {
        total += w.await.unwrap();
    }
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        during > 0,
        "the load went on during the backup ({total} pairs in all)"
    );

    let held = receipts(&file);
    let missing: Vec<&(String, u64)> = before
        .iter()
        .filter(|(k, f)| held.get(k) != Some(f))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} receipts acknowledged before the backup are not in it: {:?}",
        missing.len(),
        before.len(),
        &missing[..missing.len().min(5)]
    );
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert!(v["records"].as_u64().unwrap() >= before.len() as u64);

    // Restored into a fresh directory, the backup passes `settle check`.
    let restored = dir.path().join("restored");
    let import = std::process::Command::new(BIN)
        .args([
            "import",
            "--from",
            file.to_str().unwrap(),
            "--data",
            restored.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(import.status.success(), "{}", text(&import.stderr));
    let check = std::process::Command::new(BIN)
        .args(["check", "--data", restored.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stdout));
}
