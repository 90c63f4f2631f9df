//! Damage to acknowledged log data is refused, never cut: the store does
//! not open (a clear error naming the file and the offset) and nothing on
//! disk changes, neither by the open nor by the offline `scan` behind
//! `settle inspect` and `settle check`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use settle_core::testkit::*;
use settle_core::*;
use settle_embedded::{EmbeddedOptions, EmbeddedStore, Faults};
use settle_ledger::{Clock, Store, StoreError};
mod common;
use common::{claim_and_settle as pair, tenant};

/// The frame magic ("STL2", little-endian).
const MAGIC: [u8; 4] = [0x32, 0x4c, 0x54, 0x53];

fn opts(segment_bytes: u64, faults: Option<Arc<Faults>>) -> EmbeddedOptions {
    EmbeddedOptions {
        clock: Clock::system(),
        segment_bytes,
        faults,
        ..EmbeddedOptions::default()
    }
}

/// A store left as a crash leaves it: `pairs` claim+settle pairs in the
/// log, no checkpoint.
async fn crashed_store(dir: &Path, pairs: usize, segment_bytes: u64) {
    let faults = Arc::new(Faults::default());
    faults.halt_checkpoints.store(true, Ordering::SeqCst);
    let store = EmbeddedStore::open(dir, opts(segment_bytes, Some(faults))).unwrap();
    for i in 0..pairs {
        pair(&store, &format!("k{i}")).await;
    }
    store.close();
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir.join("wal")).unwrap() {
        let p = e.unwrap().path();
        out.insert(p.clone(), std::fs::read(&p).unwrap());
    }
    out
}

/// Where each frame of a segment starts.
fn frames(bytes: &[u8]) -> Vec<usize> {
    bytes
        .windows(4)
        .enumerate()
        .filter(|(_, w)| *w == MAGIC)
        .map(|(i, _)| i)
        .collect()
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

/// The store is refused with an error naming the file and the offset,
/// by `open` (twice) and by `scan`, and nothing on disk changes.
fn assert_refused_untouched(dir: &Path, file: &Path, offset: usize) {
    let before = snapshot(dir);
    for attempt in 0..2 {
        match EmbeddedStore::open(dir, opts(1 << 20, None)) {
            Err(StoreError::Corrupt(m)) => {
                let name = file.file_name().unwrap().to_str().unwrap();
                assert!(
                    m.contains(name) && m.contains(&format!("byte {offset}")),
                    "open #{attempt}: {m}"
                );
            }
            Err(e) => panic!("open #{attempt}: {e}"),
            Ok(_) => panic!("open #{attempt}: a damaged store was opened"),
        }
        assert!(snapshot(dir) == before, "open #{attempt} changed the log");
    }
    match settle_embedded::scan(dir, |_, _| {}) {
        Err(StoreError::Corrupt(_)) => {}
        other => panic!("scan: {other:?}"),
    }
    assert!(snapshot(dir) == before, "scan changed the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_frame_in_the_middle_of_the_last_segment_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    crashed_store(dir.path(), 20, 1 << 20).await;
    let segs = segments(dir.path());
    let last = segs.last().unwrap();
    let starts = frames(&std::fs::read(last).unwrap());
    assert!(starts.len() >= 40, "{} frames", starts.len());
    // One flipped bit in the payload of an acknowledged frame, 20 more after it.
    flip(last, starts[19] + 30);
    assert_refused_untouched(dir.path(), last, starts[19]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_frame_header_is_refused_and_left_untouched() {
    // The length (byte 5) and the magic (byte 1) are checksummed too.
    for byte in [5, 1] {
        let dir = tempfile::tempdir().unwrap();
        crashed_store(dir.path(), 10, 1 << 20).await;
        let last = segments(dir.path()).pop().unwrap();
        let starts = frames(&std::fs::read(&last).unwrap());
        flip(&last, starts[7] + byte);
        assert_refused_untouched(dir.path(), &last, starts[7]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_segment_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    crashed_store(dir.path(), 60, 8192).await;
    let segs = segments(dir.path());
    assert!(segs.len() >= 4, "{} segments", segs.len());
    std::fs::remove_file(&segs[1]).unwrap();
    let before = snapshot(dir.path());
    match EmbeddedStore::open(dir.path(), opts(8192, None)) {
        Err(StoreError::Corrupt(m)) => assert!(m.contains("is missing"), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a store with a missing segment was opened"),
    }
    assert!(snapshot(dir.path()) == before);
    assert!(settle_embedded::scan(dir.path(), |_, _| {}).is_err());
    assert!(snapshot(dir.path()) == before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intact_crashed_store_reopens_with_everything() {
    // The control case of the tests above: the same store, undamaged.
    let dir = tempfile::tempdir().unwrap();
    crashed_store(dir.path(), 20, 8192).await;
    let store = EmbeddedStore::open(dir.path(), opts(8192, None)).unwrap();
    for i in 0..20 {
        let r = store
            .get(&tenant(), &key(&format!("k{i}")))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.status, Status::Completed);
    }
}

/// `scan` (behind `settle inspect` and `check`) reads a store with a torn
/// tail without cutting it; only an open (which will write) cuts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_reads_a_torn_tail_without_cutting_it() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let store = EmbeddedStore::open(dir.path(), opts(1 << 20, Some(faults.clone()))).unwrap();
    let a = pair(&store, "a").await;
    faults.torn_write.store(true, Ordering::SeqCst);
    assert!(
        store
            .execute(&tenant(), claim("torn", 1, binding("alice", 0)))
            .await
            .is_err()
    );
    store.close();
    drop(store);

    let before = snapshot(dir.path());
    let mut seen = Vec::new();
    let report = settle_embedded::scan(dir.path(), |_, r| {
        seen.push((r.key.clone(), r.receipt.clone()))
    })
    .unwrap();
    assert!(report.torn_tail.is_some(), "{report:?}");
    assert_eq!(seen, vec![(key("a"), Some(a))]);
    assert!(snapshot(dir.path()) == before, "scan cut the torn tail");
    // An open does cut it (and keeps everything acknowledged).
    drop(EmbeddedStore::open(dir.path(), opts(1 << 20, None)).unwrap());
    assert!(snapshot(dir.path()) != before);
}
