//! The portable format on the embedded engine (SPEC §12): live and offline
//! export, import into an empty directory, refusals that write nothing.

use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use settle_core::testkit::*;
use settle_core::{
    ClaimDecision, Command, Receipt, Record, Reply, TaskId, TenantId, Warn, WarningClass,
};
use settle_embedded::{EmbeddedOptions, EmbeddedStore, export_dir, import};
use settle_ledger::Store;
use settle_ledger::export::{ImportError, export_to};
use settle_portable::{Entity, Reader, Summary};

fn tenant(t: &str) -> TenantId {
    TenantId::new(t).unwrap()
}

fn opts() -> EmbeddedOptions {
    EmbeddedOptions {
        // Small segments: the data ends up split between the index
        // (checkpointed) and memory (the open segment).
        segment_bytes: 256 * 1024,
        ..EmbeddedOptions::default()
    }
}

/// Claims and settles `key` for `t`; the receipt.
async fn pair(store: &EmbeddedStore, t: &TenantId, key: &str) -> Receipt {
    let fence = match store
        .execute(t, claim(key, 1, binding("alice", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => g.fence,
        other => panic!("{key}: {other:?}"),
    };
    match store
        .execute(t, settle(key, fence, 1, binding("alice", 0), completed(1)))
        .await
        .unwrap()
    {
        Reply::Receipt(r) => r,
        other => panic!("{key}: {other:?}"),
    }
}

/// A store with settled and open records in two tenants, a principal moved
/// by a revoke and a warning task; its receipts.
async fn populated(dir: &Path, n: usize) -> (Arc<EmbeddedStore>, Vec<(TenantId, String, Receipt)>) {
    let store = EmbeddedStore::open(dir, opts()).unwrap();
    let mut receipts = Vec::new();
    for i in 0..n {
        let t = tenant(if i % 3 == 0 { "beta" } else { "acme" });
        let k = format!("order-{i:05}");
        receipts.push((t.clone(), k.clone(), pair(&store, &t, &k).await));
    }
    for i in 0..5 {
        let r = store
            .execute(
                &tenant("acme"),
                claim(&format!("open-{i}"), 2, binding("bob", 0)),
            )
            .await
            .unwrap();
        assert!(matches!(r, Reply::Claim(ClaimDecision::Execute(_))));
    }
    store
        .execute(&tenant("acme"), revoke("carol"))
        .await
        .unwrap();
    store
        .execute(
            &tenant("beta"),
            Command::Warn(Warn {
                task: TaskId::new("nightly").unwrap(),
                class: WarningClass::new("slow").unwrap(),
                detail: None,
            }),
        )
        .await
        .unwrap();
    (store, receipts)
}

async fn export_file(store: &dyn Store, file: &Path) -> Summary {
    let out = std::io::BufWriter::new(std::fs::File::create(file).unwrap());
    let (_, summary) = export_to(store, out, |_, _| {}).await.unwrap();
    summary
}

fn entities(file: &Path) -> Vec<Entity> {
    let bytes = std::fs::read(file).unwrap();
    Reader::new(&bytes[..])
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
}

async fn get(store: &EmbeddedStore, t: &TenantId, k: &str) -> Record {
    store.get(t, &key(k)).await.unwrap().unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_keeps_every_entity_and_replays_byte_for_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let (store, receipts) = populated(&tmp.path().join("a"), 600).await;
    let file = tmp.path().join("a.settle");
    let exported = export_file(&*store, &file).await;
    assert_eq!(exported.records, 605);
    assert_eq!(exported.principals, 1);
    assert_eq!(exported.warning_tasks, 1);
    store.close();
    drop(store);

    // The stopped store exports the same entities as the live one did.
    let offline = tmp.path().join("a-offline.settle");
    let (_, off) = export_dir(
        tmp.path().join("a"),
        std::fs::File::create(&offline).unwrap(),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(off.tenants, exported.tenants);

    let report = import(tmp.path().join("b"), &file, 1_000, |_, _| {}).unwrap();
    assert_eq!(
        report.summary,
        settle_portable::verify(&std::fs::read(&file).unwrap()[..]).unwrap()
    );
    assert_eq!(report.fence_floor, exported.import_floor(1_000).unwrap());
    let b = EmbeddedStore::open(tmp.path().join("b"), opts()).unwrap();
    let again = tmp.path().join("b.settle");
    let reexported = export_file(&*b, &again).await;
    assert_eq!(reexported.tenants, exported.tenants, "per-tenant digests");
    assert_eq!(entities(&again), entities(&file));

    // A retry of a settled key replays its receipt byte for byte.
    for (t, k, r) in receipts.iter().step_by(97) {
        let rec = get(&b, t, k).await;
        assert_eq!(rec.receipt.as_ref(), Some(r), "{k}");
        let fence = rec.last_fence().unwrap();
        let replay = b
            .execute(t, settle(k, fence, 1, binding("alice", 0), completed(1)))
            .await
            .unwrap();
        assert_eq!(replay, Reply::Receipt(r.clone()), "{k}");
    }
    // A new lease's fence is above every fence the file saw.
    match b
        .execute(
            &tenant("acme"),
            claim("after-import", 1, binding("alice", 0)),
        )
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::Execute(g)) => {
            assert!(
                g.fence.0 >= report.fence_floor,
                "{} < {}",
                g.fence.0,
                report.fence_floor
            );
            assert!(g.fence.0 > exported.max_fence);
        }
        other => panic!("{other:?}"),
    }
    // An open lease came over open: the sweep and a duplicate see it.
    match b
        .execute(&tenant("acme"), claim("open-1", 2, binding("bob", 0)))
        .await
        .unwrap()
    {
        Reply::Claim(ClaimDecision::InFlight { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.generation(&tenant("acme"), &principal("carol"))
            .await
            .unwrap(),
        Ok(1)
    );
    b.close();
}

fn principal(p: &str) -> settle_core::Principal {
    settle_core::Principal::new(p).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_export_holds_every_receipt_acknowledged_before_it_started() {
    let tmp = tempfile::tempdir().unwrap();
    let store = EmbeddedStore::open(tmp.path().join("live"), opts()).unwrap();
    let t = tenant("acme");
    let mut before = Vec::new();
    for i in 0..400 {
        let k = format!("before-{i:04}");
        before.push((k.clone(), pair(&store, &t, &k).await));
    }
    // Writers go on during the export.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..4 {
        let (store, stop, t) = (store.clone(), stop.clone(), t.clone());
        load.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                pair(&store, &t, &format!("during-{w}-{i:05}")).await;
                i += 1;
            }
            i
        }));
    }
    let file = tmp.path().join("live.settle");
    let summary = export_file(&*store, &file).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut during = 0;
    for l in load {
        during += l.await.unwrap();
    }
    assert!(during > 0, "the load ran");
    let got = entities(&file);
    assert_eq!(
        got.len() as u64,
        summary.records + summary.principals + summary.warning_tasks
    );
    for (k, r) in &before {
        let found = got.iter().any(|e| {
            matches!(e, Entity::Record { record, .. } if record.key.as_str() == k && record.receipt.as_ref() == Some(r))
        });
        assert!(
            found,
            "{k} acknowledged before the export is missing from it"
        );
    }
    // No record half-settled: every record in the file passes §6's checks.
    for e in &got {
        if let Entity::Record { record, .. } = e {
            settle_core::invariants::check_record(record).unwrap();
        }
    }
    store.close();
}

/// A live export is the store at the instant it marked, though the map is
/// read after writes resumed: records settled and claimed between the
/// instant and the read are in the file as they were at the instant
/// (kept by the publishes that replaced them), keys first written in
/// between are not in it. Writes wait only for the instant to be marked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_export_is_one_instant_while_writes_go_on_during_its_read() {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(settle_embedded::Faults::default());
    let store = EmbeddedStore::open(
        tmp.path().join("live"),
        EmbeddedOptions {
            faults: Some(faults.clone()),
            ..opts()
        },
    )
    .unwrap();
    let t = tenant("acme");
    let mut open = Vec::new();
    for i in 0..10 {
        let k = format!("open-{i}");
        match store
            .execute(&t, claim(&k, 1, binding("alice", 0)))
            .await
            .unwrap()
        {
            Reply::Claim(ClaimDecision::Execute(g)) => open.push((k, g.fence)),
            other => panic!("{other:?}"),
        }
    }
    let settled_before = pair(&store, &t, "settled-before").await;
    // Between the instant and the read of the map: settle half of the open
    // records, claim new keys (each acknowledged, so published).
    let (hook_store, hook_t, to_settle) = (store.clone(), t.clone(), open[..5].to_vec());
    let rt = tokio::runtime::Handle::current();
    *faults.export_hook.lock() = Some(Arc::new(move || {
        for (k, fence) in &to_settle {
            let r = rt
                .block_on(hook_store.execute(
                    &hook_t,
                    settle(k, *fence, 1, binding("alice", 0), completed(1)),
                ))
                .unwrap();
            assert!(matches!(r, Reply::Receipt(_)), "{r:?}");
        }
        for i in 0..3 {
            rt.block_on(
                hook_store.execute(&hook_t, claim(&format!("new-{i}"), 1, binding("alice", 0))),
            )
            .unwrap();
        }
    }));
    let file = tmp.path().join("live.settle");
    export_file(&*store, &file).await;
    *faults.export_hook.lock() = None;

    let records: std::collections::BTreeMap<String, Record> = entities(&file)
        .into_iter()
        .filter_map(|e| match e {
            Entity::Record { record, .. } => Some((record.key.to_string(), record)),
            _ => None,
        })
        .collect();
    for (k, _) in &open {
        let r = &records[k];
        assert!(
            r.receipt.is_none(),
            "{k}: the file holds a state after the instant: {r:?}"
        );
        assert!(!r.status.is_terminal(), "{k}: {:?}", r.status);
    }
    assert_eq!(
        records["settled-before"].receipt.as_ref(),
        Some(&settled_before)
    );
    for i in 0..3 {
        assert!(
            !records.contains_key(&format!("new-{i}")),
            "new-{i} was written after the instant"
        );
    }
    assert_eq!(records.len(), open.len() + 1);
    // The store itself went on: the records settled in between are settled.
    for (k, _) in &open[..5] {
        assert!(get(&store, &t, k).await.receipt.is_some(), "{k}");
    }
    store.close();
}

#[test]
fn an_import_refuses_damage_and_a_non_empty_target_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let file = tmp.path().join("ok.settle");
    rt.block_on(async {
        let (store, _) = populated(&tmp.path().join("src"), 50).await;
        export_file(&*store, &file).await;
        store.close();
    });
    let bytes = std::fs::read(&file).unwrap();
    let target = tmp.path().join("target");

    let mut flipped = bytes.clone();
    flipped[bytes.len() / 2] ^= 0x01;
    let truncated = bytes[..bytes.len() - 10].to_vec();
    let text = String::from_utf8(bytes.clone()).unwrap();
    let first = text.split('\n').next().unwrap();
    let newer_json = first[9..].replace(
        &format!("\"version\":{}", settle_portable::VERSION),
        &format!("\"version\":{}", settle_portable::VERSION + 1),
    );
    assert_ne!(
        newer_json,
        first[9..],
        "the header names this build's version"
    );
    let newer = format!(
        "{:08x} {newer_json}\n{}",
        crc32fast::hash(newer_json.as_bytes()),
        &text[first.len() + 1..]
    );
    for (name, damaged, want) in [
        ("flipped", flipped, "damaged at byte"),
        ("truncated", truncated, "truncated at byte"),
        ("newer", newer.into_bytes(), "newer than this build"),
    ] {
        let f = tmp.path().join(name);
        std::fs::write(&f, damaged).unwrap();
        let err = import(&target, &f, 1_000, |_, _| {}).unwrap_err();
        assert!(err.to_string().contains(want), "{name}: {err}");
        assert!(!target.exists(), "{name}: the target was written");
        assert!(
            std::fs::read_dir(tmp.path()).unwrap().all(|e| !e
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".import-")),
            "{name}: a half-built store was left"
        );
    }

    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("something"), b"x").unwrap();
    let err = import(&target, &file, 1_000, |_, _| {}).unwrap_err();
    assert!(matches!(err, ImportError::NotEmpty(_)), "{err}");
    assert_eq!(
        std::fs::read_dir(&target).unwrap().count(),
        1,
        "nothing written"
    );

    // An empty directory is a fine target.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    import(&empty, &file, 1_000, |_, _| {}).unwrap();
    assert!(empty.join("wal").is_dir());
}

/// Two imports into one target at a time: the second is refused before
/// it builds anything (it would have taken the first one's build beside
/// the target for a killed import's and deleted it).
#[test]
fn a_second_import_into_the_same_target_is_refused_while_one_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let file = tmp.path().join("ok.settle");
    rt.block_on(async {
        let (store, _) = populated(&tmp.path().join("src"), 5).await;
        export_file(&*store, &file).await;
        store.close();
    });
    let target = tmp.path().join("target");
    // What a running import holds.
    let held = std::fs::File::create(tmp.path().join(".target.import.lock")).unwrap();
    held.try_lock().unwrap();
    let err = import(&target, &file, 1_000, |_, _| {}).unwrap_err();
    assert!(err.to_string().contains("another import into"), "{err}");
    assert!(!target.exists());
    drop(held);
    import(&target, &file, 1_000, |_, _| {}).unwrap();
    assert!(target.join("wal").is_dir());
}

/// Random stores: claims (settled, failed, left open), revokes and warnings
/// over a few tenants, then export, import and export again.
fn ops() -> impl Strategy<Value = Vec<(u8, u8, u8)>> {
    prop::collection::vec((0..3u8, 0..4u8, 0..24u8), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn export_then_import_is_the_identity(ops in ops()) {
        let tmp = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (a, b) = rt.block_on(async {
            let store = EmbeddedStore::open(tmp.path().join("a"), opts()).unwrap();
            for (t, op, k) in ops {
                let t = tenant(["acme", "beta", "c-1"][t as usize]);
                let k = format!("k{k}");
                match op {
                    0 => {
                        let r = store.execute(&t, claim(&k, 1, binding("alice", 0))).await.unwrap();
                        if let Reply::Claim(ClaimDecision::Execute(g)) = r {
                            store.execute(&t, settle(&k, g.fence, 1, binding("alice", 0), completed(2))).await.unwrap();
                        }
                    }
                    1 => {
                        store.execute(&t, claim(&k, 1, binding("alice", 0))).await.unwrap();
                    }
                    2 => {
                        store.execute(&t, revoke(&format!("p{k}"))).await.unwrap();
                    }
                    _ => {
                        store.execute(&t, Command::Warn(Warn {
                            task: TaskId::new(&k).unwrap(),
                            class: WarningClass::new("c").unwrap(),
                            detail: None,
                        })).await.unwrap();
                    }
                }
            }
            let a = tmp.path().join("a.settle");
            export_file(&*store, &a).await;
            store.close();
            drop(store);
            import(tmp.path().join("b"), &a, 10, |_, _| {}).unwrap();
            let b_store = EmbeddedStore::open(tmp.path().join("b"), opts()).unwrap();
            let b = tmp.path().join("b.settle");
            export_file(&*b_store, &b).await;
            b_store.close();
            (a, b)
        });
        prop_assert_eq!(entities(&a), entities(&b));
    }
}
