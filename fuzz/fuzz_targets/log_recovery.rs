//! Recovery of the embedded engine's log (settle-embedded `recovery`,
//! through `InlineStore::open` on `settle-sim`'s simulated disk): what
//! happens to bytes of a log segment that changed while the store was
//! closed.
//!
//! A template store holds three group commits in its log (`a` claimed;
//! `b` claimed and settled; `c` claimed, the last frame), nothing
//! checkpointed. Input: triples (offset LE u16, xor) flipped into its
//! segment before it is opened again.
//!
//! Properties: opening never panics; when it succeeds, every record read
//! holds the stored-record invariants, `a` and `b` (not in the last frame,
//! so no torn write explains losing them) read as they were written, `c`
//! reads as written or, cut as a torn tail, not at all; and a second open
//! of what the first left agrees with it.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use settle_core::testkit::{binding, claim, completed, key, settle};
use settle_core::{Record, Reply, TenantId, Timestamp, invariants};
use settle_embedded::{EmbeddedOptions, InlineStore};
use settle_ledger::Clock;
use settle_sim::disk::{Crash, MemIndex, SimDisk};

const DIR: &str = "/d";
const KEYS: [&str; 3] = ["a", "b", "c"];

struct Template {
    disk: SimDisk,
    index: MemIndex,
    segment: String,
    /// What each of [`KEYS`] reads as.
    records: Vec<Option<Record>>,
}

fn opts() -> EmbeddedOptions {
    EmbeddedOptions {
        clock: Clock::with_source(|| Timestamp(1_764_460_800_000)),
        segment_bytes: 4096,
        ..EmbeddedOptions::default()
    }
}

fn tenant() -> TenantId {
    TenantId::default_tenant()
}

fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| {
        let disk = SimDisk::new();
        let index = MemIndex::new(&disk, DIR);
        let store = InlineStore::open(&disk, DIR, index.clone(), opts()).expect("a new store");
        let t = tenant();
        store
            .execute_now(&t, claim("a", 1, binding("alice", 0)))
            .unwrap();
        let Reply::Claim(d) = store
            .execute_now(&t, claim("b", 2, binding("alice", 0)))
            .unwrap()
        else {
            panic!("claim answers a decision")
        };
        let fence = d.grant().expect("a grant").fence;
        store
            .execute_now(&t, settle("b", fence, 2, binding("alice", 0), completed(1)))
            .unwrap();
        store
            .execute_now(&t, claim("c", 3, binding("bob", 0)))
            .unwrap();
        let records = read_all(&store);
        assert!(
            records.iter().all(Option::is_some),
            "the template holds its records"
        );
        drop(store); // not closed: nothing is checkpointed
        let wal = Path::new(DIR).join("wal");
        let mut logs: Vec<String> = settle_embedded::fs::Fs::list(&disk, &wal)
            .unwrap()
            .into_iter()
            .filter(|n| n.ends_with(".log"))
            .collect();
        logs.sort();
        assert_eq!(logs.len(), 1, "one segment: {logs:?}");
        Template {
            segment: wal.join(&logs[0]).to_string_lossy().into_owned(),
            disk,
            index,
            records,
        }
    })
}

fn read_all<F: settle_embedded::fs::Fs, I: settle_embedded::index::Index>(
    store: &InlineStore<F, I>,
) -> Vec<Option<Record>> {
    KEYS.iter()
        .map(|k| match store.get_now(&tenant(), &key(k)) {
            Ok(Ok(r)) => r,
            other => panic!("get {k} on an open store: {other:?}"),
        })
        .collect()
}

fn reopen(disk: &SimDisk, index: &MemIndex) -> Option<Vec<Option<Record>>> {
    let disk = disk.snapshot();
    let index = index.crash(&disk, Crash::Keep);
    let store = InlineStore::open(&disk, DIR, index, opts()).ok()?;
    Some(read_all(&store))
}

fuzz_target!(|data: &[u8]| {
    let t = template();
    let disk = t.disk.snapshot();
    let index = t.index.crash(&disk, Crash::Keep);
    let path = Path::new(&t.segment);
    let len = disk.contents(path).unwrap().len() as u64;
    for m in data.chunks_exact(3) {
        let offset = u64::from(u16::from_le_bytes([m[0], m[1]])) % len;
        disk.corrupt(path, offset, m[2]).unwrap();
    }
    let Ok(store) = InlineStore::open(&disk, DIR, index.clone(), opts()) else {
        return; // refused: damage is reported, nothing is guessed
    };
    let got = read_all(&store);
    for r in got.iter().flatten() {
        if let Err(v) = invariants::check_record(r) {
            panic!("a recovered record breaks {v}: {r:?}");
        }
    }
    assert_eq!(got[0], t.records[0], "a (first frame) is lost or changed");
    assert_eq!(
        got[1], t.records[1],
        "b (not the last frame) is lost or changed"
    );
    assert!(
        got[2].is_none() || got[2] == t.records[2],
        "c reads as neither what was written nor absent: {:?}",
        got[2]
    );
    drop(store);
    let again = reopen(&disk, &index).expect("a store that opened opens again");
    assert_eq!(again, got, "a second recovery disagrees with the first");
});
