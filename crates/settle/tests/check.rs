//! `settle inspect` and `settle check` on damaged stores: they report and
//! never repair (nothing on disk changes), and `check` fails.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;
use settle_core::testkit::*;
use settle_core::*;
use settle_embedded::index::{CheckpointItem, FjallIndex, Index};
use settle_embedded::{EmbeddedOptions, EmbeddedStore, Faults};
use settle_ledger::Store;

use common::{BIN, TempDir};

fn tenant() -> TenantId {
    TenantId::new("acme").unwrap()
}

/// A store as a crash leaves it: `pairs` pairs in the log, not checkpointed.
async fn crashed_store(dir: &Path, pairs: usize) {
    let faults = Arc::new(Faults::default());
    faults.halt_checkpoints.store(true, Ordering::SeqCst);
    let store = EmbeddedStore::open(
        dir,
        EmbeddedOptions {
            faults: Some(faults),
            ..EmbeddedOptions::default()
        },
    )
    .unwrap();
    for i in 0..pairs {
        let k = format!("k{i}");
        let f = match store
            .execute(&tenant(), claim(&k, 1, binding("alice", 0)))
            .await
            .unwrap()
        {
            Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
            other => panic!("{other:?}"),
        };
        store
            .execute(
                &tenant(),
                settle(&k, f, 1, binding("alice", 0), completed(1)),
            )
            .await
            .unwrap();
    }
    store.close();
}

fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

fn run(args: &[&str], dir: &Path) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(args)
        .arg(dir)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_check_refuse_a_damaged_log_and_change_nothing() {
    let dir = TempDir::new("check-damaged");
    crashed_store(dir.path(), 20).await;
    let seg = files(dir.path())
        .into_keys()
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .unwrap();
    let mut b = std::fs::read(&seg).unwrap();
    // A flipped bit in the middle of the acknowledged frames.
    let magic = [0x32, 0x4c, 0x54, 0x53];
    let starts: Vec<usize> = (0..b.len() - 4).filter(|&i| b[i..i + 4] == magic).collect();
    b[starts[20] + 30] ^= 0x08;
    std::fs::write(&seg, &b).unwrap();
    let before = files(dir.path());
    for cmd in [
        &["check", "--data"][..],
        &["inspect", "--data"],
        &["check", "--json", "--data"],
    ] {
        let out = run(cmd, dir.path());
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("damaged at byte {}", starts[20]))
                && err.contains(seg.file_name().unwrap().to_str().unwrap()),
            "{cmd:?}: {err}"
        );
        assert!(files(dir.path()) == before, "{cmd:?} changed the log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_undecodable_records_and_fails() {
    let dir = TempDir::new("check-undecodable");
    crashed_store(dir.path(), 3).await;
    {
        let index = FjallIndex::open(&dir.path().join("index")).unwrap();
        index
            .ingest(
                &[CheckpointItem {
                    key: b"racme\0bad",
                    open: false,
                    expires_at: None,
                    value: &[1, 0xff, 0xff],
                    listed: true,
                }],
                &|| {},
            )
            .unwrap();
    }
    let out = run(&["inspect", "--json", "--data"], dir.path());
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["records"], 3);
    let bad = v["undecodable"].as_array().unwrap();
    assert_eq!(bad.len(), 1, "{v}");
    assert!(bad[0].as_str().unwrap().starts_with("acme/bad"), "{v}");
    let out = run(&["check", "--data"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("undecodable (refused on every call): 1")
    );
}
