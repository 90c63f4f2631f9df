//! The portable format against a real PostgreSQL (SPEC §12): export from
//! one consistent snapshot, live; import into an empty schema only, all or
//! nothing; every entity, digest, record and receipt survives the round trip.
#![allow(missing_docs)]

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{SchemaGuard, options, side_client, unique_schema, url};
use settle_core::testkit::{
    binding, claim, claim_with, completed, dispatch, failed, receipt, revoke, settle, unknown,
};
use settle_core::{
    ClaimDecision, Command, Fence, Receipt, Reply, TaskId, TenantId, Text, Warn, WarningClass,
};
use settle_ledger::export::{ExportError, ImportError, export_to};
use settle_ledger::{Clock, MemStore, Store, StoreError};
use settle_pg::{PgStore, import};
use settle_portable::{Entity, Header, Reader, Summary, Writer};

const MARGIN: u64 = 1000;

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

async fn run(store: &impl Store, t: &TenantId, cmd: Command) -> Reply {
    store.execute(t, cmd).await.unwrap()
}

async fn fence(store: &impl Store, t: &TenantId, cmd: Command) -> Fence {
    match run(store, t, cmd).await {
        Reply::Claim(ClaimDecision::Execute(g) | ClaimDecision::Reconcile(g)) => g.fence,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// A settled call: the tenant, the settle that was acknowledged, its receipt.
struct Settled {
    tenant: TenantId,
    key: String,
    settle: Command,
    receipt: Receipt,
}

/// Records in every state the rules produce, principals moved, warnings.
async fn populate(store: &impl Store, t: &TenantId) -> Vec<Settled> {
    let mut settled = Vec::new();
    for i in 0..20u8 {
        let k = format!("done-{i}");
        let f = fence(store, t, claim(&k, 1, binding("alice", 0))).await;
        let outcome = if i % 3 == 0 { failed(i) } else { completed(i) };
        let cmd = settle(&k, f, 1, binding("alice", 0), outcome);
        let r = receipt(run(store, t, cmd.clone()).await);
        settled.push(Settled {
            tenant: t.clone(),
            key: k,
            settle: cmd,
            receipt: r,
        });
    }
    // An open lease, dispatched.
    let f = fence(
        store,
        t,
        claim_with("open", 2, binding("alice", 0), 600_000, false),
    )
    .await;
    run(store, t, dispatch("open", f)).await;
    // Settled unknown: open, reconcile required.
    let f = fence(store, t, claim("unk", 3, binding("alice", 0))).await;
    run(
        store,
        t,
        settle("unk", f, 3, binding("alice", 0), unknown()),
    )
    .await;
    // A settle under a wrong fence: quarantined evidence.
    let f = fence(store, t, claim("quar", 4, binding("alice", 0))).await;
    run(
        store,
        t,
        settle(
            "quar",
            Fence(f.0 + 77),
            4,
            binding("alice", 0),
            completed(9),
        ),
    )
    .await;
    run(
        store,
        t,
        settle("quar", f, 4, binding("alice", 0), completed(4)),
    )
    .await;
    // A lease whose principal is revoked.
    fence(
        store,
        t,
        claim_with("bob-1", 5, binding("bob", 0), 600_000, false),
    )
    .await;
    run(store, t, revoke("bob")).await;
    run(store, t, revoke("carol")).await;
    for (task, class) in [("task-1", "slow"), ("task-1", "odd"), ("task-2", "slow")] {
        run(
            store,
            t,
            Command::Warn(Warn {
                task: TaskId::new(task).unwrap(),
                class: WarningClass::new(class).unwrap(),
                detail: Some(Text::new("detail", format!("{task}/{class}")).unwrap()),
            }),
        )
        .await;
    }
    settled
}

async fn export_file(store: &impl Store, path: &Path) -> Summary {
    let f = std::fs::File::create(path).unwrap();
    let (_, summary) = export_to(store, std::io::BufWriter::new(f), |_, _| {})
        .await
        .unwrap();
    summary
}

fn entities(path: &Path) -> Vec<Entity> {
    let bytes = std::fs::read(path).unwrap();
    Reader::new(&bytes[..])
        .unwrap()
        .map(|e| e.unwrap())
        .collect()
}

/// An empty target schema (migrated, as a store opens it), with its guard.
async fn empty_target(prefix: &str) -> (PgStore, SchemaGuard) {
    let (store, _, guard) = common::store(prefix).await;
    (store, guard)
}

/// The target's rows, counted from the side.
async fn rows(schema: &str) -> (i64, i64, i64) {
    let c = side_client().await;
    let q = format!(
        "SELECT (SELECT count(*) FROM \"{schema}\".settle_records), \
                (SELECT count(*) FROM \"{schema}\".settle_principals), \
                (SELECT count(*) FROM \"{schema}\".settle_warnings)"
    );
    let r = c.query_one(&q, &[]).await.unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// `dst`, imported from `src`'s export `file`, answers as `src` does: every
/// record reads the same, every settle replays its receipt byte for byte,
/// and a claim of a settled key replays it too.
async fn same_answers(src: &PgStore, dst: &PgStore, file: &[Entity], settled: &[Settled]) {
    // Every record reads the same on both sides.
    for e in file {
        if let Entity::Record { tenant, record } = e {
            let (a, b) = (
                src.get(tenant, &record.key).await.unwrap(),
                dst.get(tenant, &record.key).await.unwrap(),
            );
            assert_eq!(a, b, "{tenant}/{}", record.key);
        }
    }
    // A replayed settle answers the receipt, byte for byte; so does a claim.
    for s in settled {
        let Reply::Receipt(r) = run(dst, &s.tenant, s.settle.clone()).await else {
            panic!("a replayed settle answers its receipt")
        };
        assert_eq!(
            postcard::to_allocvec(&r).unwrap(),
            postcard::to_allocvec(&s.receipt).unwrap()
        );
        assert_eq!(r, s.receipt);
        match run(dst, &s.tenant, claim(&s.key, 1, binding("alice", 0))).await {
            Reply::Claim(ClaimDecision::Replay { receipt, .. }) => assert_eq!(receipt, s.receipt),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_round_trip_through_a_file_keeps_every_entity_record_and_receipt() {
    let (src, _, _g1) = common::store("prt_src").await;
    let mut settled = Vec::new();
    for t in ["acme", "beta"] {
        settled.extend(populate(&src, &tenant(t)).await);
    }
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("a.settle"), dir.path().join("b.settle"));
    let exported = export_file(&src, &first).await;
    assert_eq!(exported.engine, "postgres");
    assert_eq!(exported.records, 2 * 24);
    assert_eq!(exported.principals, 2 * 2);
    assert_eq!(exported.warning_tasks, 2 * 2);
    assert!(exported.fence_floor > exported.max_fence);

    let schema = unique_schema("prt_dst");
    let _g2 = SchemaGuard::new(&url(), &schema);
    let mut calls = Vec::new();
    let report = import(
        &url(),
        options(&schema, Clock::system()),
        &first,
        MARGIN,
        |n, b| calls.push((n, b)),
    )
    .await
    .unwrap();
    assert_eq!(report.summary, exported);
    assert_eq!(report.fence_floor, exported.import_floor(MARGIN).unwrap());
    let total = exported.records + exported.principals + exported.warning_tasks;
    assert_eq!(calls.last(), Some(&(total, exported.bytes)));
    assert!(calls.windows(2).all(|w| w[0] <= w[1]), "{calls:?}");

    let dst = PgStore::connect(&url(), options(&schema, Clock::system()))
        .await
        .unwrap();
    let again = export_file(&dst, &second).await;
    assert_eq!(entities(&first), entities(&second));
    assert_eq!(again.tenants, exported.tenants);
    assert_eq!(
        (
            again.records,
            again.principals,
            again.warning_tasks,
            again.max_fence
        ),
        (
            exported.records,
            exported.principals,
            exported.warning_tasks,
            exported.max_fence
        )
    );
    assert!(again.fence_floor >= exported.import_floor(MARGIN).unwrap());

    same_answers(&src, &dst, &entities(&first), &settled).await;
    // A new claim on the target gets a fence past every fence the file saw.
    let f = fence(&dst, &tenant("acme"), claim("new", 1, binding("alice", 0))).await;
    assert!(f.0 >= exported.import_floor(MARGIN).unwrap(), "{f:?}");
    assert!(f.0 > exported.max_fence && f.0 >= exported.fence_floor);
    // Bob's revocation survives.
    assert_eq!(
        dst.generation(
            &tenant("acme"),
            &settle_core::Principal::new("bob").unwrap()
        )
        .await
        .unwrap(),
        Ok(1)
    );
}

/// The file `good` with `edit` applied, in `dir`.
fn edited(
    dir: &Path,
    name: &str,
    good: &[u8],
    edit: impl FnOnce(&mut Vec<u8>),
) -> std::path::PathBuf {
    let mut bytes = good.to_vec();
    edit(&mut bytes);
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[tokio::test]
async fn an_import_is_refused_into_a_non_empty_target_or_from_a_damaged_file() {
    let (src, _, _g1) = common::store("pri_src").await;
    populate(&src, &tenant("acme")).await;
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.settle");
    export_file(&src, &good).await;

    // A non-empty target: refused, nothing changed (rows, fence counter).
    let (busy, _g2) = empty_target("pri_busy").await;
    fence(
        &busy,
        &tenant("acme"),
        claim("mine", 1, binding("alice", 0)),
    )
    .await;
    let before = (rows(busy.schema()).await, busy.fence_floor().await.unwrap());
    let r = import(
        &url(),
        options(busy.schema(), Clock::system()),
        &good,
        MARGIN,
        |_, _| {},
    )
    .await;
    assert!(
        matches!(&r, Err(ImportError::NotEmpty(m)) if m.contains("records")),
        "{r:?}"
    );
    assert_eq!(
        before,
        (rows(busy.schema()).await, busy.fence_floor().await.unwrap())
    );
    assert_eq!(before.0, (1, 0, 0));

    // Damaged files: refused before anything is written.
    let (empty, _g3) = empty_target("pri_empty").await;
    let bytes = std::fs::read(&good).unwrap();
    let second_line = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    let flipped = edited(dir.path(), "flipped", &bytes, |b| {
        b[second_line + 40] ^= 0x01
    });
    let truncated = edited(dir.path(), "truncated", &bytes, |b| {
        b.truncate(b.len() - 10)
    });
    let cut_at_a_line = edited(dir.path(), "cut", &bytes, |b| {
        let last = b[..b.len() - 1].iter().rposition(|&c| c == b'\n').unwrap();
        b.truncate(last + 1);
    });
    let newer = dir.path().join("newer");
    {
        let header = Header {
            version: settle_portable::VERSION + 1,
            ..Header::new("postgres", 1, 129)
        };
        let w = Writer::new(std::fs::File::create(&newer).unwrap(), header).unwrap();
        w.finish(1).unwrap();
    }
    for (p, want) in [
        (&flipped, "damaged"),
        (&truncated, "truncated"),
        (&cut_at_a_line, "truncated"),
        (&newer, "newer"),
    ] {
        let r = import(
            &url(),
            options(empty.schema(), Clock::system()),
            p,
            MARGIN,
            |_, _| {},
        )
        .await;
        use settle_portable::Error as E;
        let ok = matches!(
            (&r, want),
            (Err(ImportError::Format(E::Damaged { .. })), "damaged")
                | (Err(ImportError::Format(E::Truncated { .. })), "truncated")
                | (Err(ImportError::Format(E::NewerVersion { .. })), "newer")
        );
        assert!(ok, "{p:?}: expected {want}, got {r:?}");
        assert_eq!(rows(empty.schema()).await, (0, 0, 0));
        assert_eq!(empty.fence_floor().await.unwrap(), 1);
    }
    // The good file still goes in.
    import(
        &url(),
        options(empty.schema(), Clock::system()),
        &good,
        MARGIN,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_ne!(rows(empty.schema()).await, (0, 0, 0));
}

/// A schema's version, whether it has the commits table (version 2's), and
/// how many columns its tables have.
async fn shape(side: &tokio_postgres::Client, s: &str) -> (i32, bool, i64) {
    let r = side
        .query_one(
            &format!(
                "SELECT (SELECT max(version) FROM \"{s}\".settle_schema_version), \
                        to_regclass('\"{s}\".settle_commits') IS NOT NULL, \
                        (SELECT count(*) FROM information_schema.columns \
                         WHERE table_schema = $1)"
            ),
            &[&s],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// A target holding a store of an older schema version, with rows: the
/// import is refused before the schema is migrated, so the refusal leaves
/// it exactly as it was (version, tables, columns, rows).
#[tokio::test]
async fn an_import_into_an_older_store_is_refused_before_migrating_it() {
    let mem = MemStore::default();
    fence(
        &mem,
        &tenant("acme"),
        claim("theirs", 1, binding("alice", 0)),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.settle");
    export_file(&mem, &file).await;

    let (old, _g) = empty_target("pri_old").await;
    fence(&old, &tenant("acme"), claim("mine", 1, binding("alice", 0))).await;
    old.close();
    // Back to the shape of schema version 1, as migration 2 finds it.
    let side = side_client().await;
    let s = old.schema().to_string();
    side.batch_execute(&format!(
        "DROP TABLE \"{s}\".settle_commits; \
         ALTER TABLE \"{s}\".settle_records DROP COLUMN disputed; \
         ALTER TABLE \"{s}\".settle_principals DROP COLUMN moves; \
         DELETE FROM \"{s}\".settle_schema_version WHERE version = 2;"
    ))
    .await
    .unwrap();
    let before = (shape(&side, &s).await, rows(&s).await);
    assert_eq!(before.0.0, 1);
    assert!(!before.0.1);
    assert_eq!(before.1, (1, 0, 0));

    let r = import(
        &url(),
        options(&s, Clock::system()),
        &file,
        MARGIN,
        |_, _| {},
    )
    .await;
    assert!(
        matches!(&r, Err(ImportError::NotEmpty(m)) if m.contains("records")),
        "{r:?}"
    );
    assert_eq!(before, (shape(&side, &s).await, rows(&s).await));
}

/// `chunks` × 200 settled records, claimed and settled in batches: the keys
/// and their receipts.
async fn settled_base(store: &PgStore, t: &TenantId, chunks: usize) -> Vec<(String, Receipt)> {
    let mut base = Vec::new();
    for chunk in 0..chunks {
        let keys: Vec<String> = (0..200).map(|i| format!("base-{chunk}-{i}")).collect();
        let claims = keys
            .iter()
            .map(|k| claim(k, 1, binding("alice", 0)))
            .collect();
        let replies = store.execute_batch(t, claims).await;
        let settles = replies
            .into_iter()
            .zip(&keys)
            .map(|(r, k)| {
                let Ok(Reply::Claim(ClaimDecision::Execute(g))) = r else {
                    panic!("{r:?}")
                };
                settle(k, g.fence, 1, binding("alice", 0), completed(1))
            })
            .collect();
        for (r, k) in store.execute_batch(t, settles).await.into_iter().zip(keys) {
            base.push((k, receipt(r.unwrap())));
        }
    }
    base
}

/// Claims and settles new keys until `stop`: each key, its receipt, and
/// whether it was acknowledged before `started` was set.
async fn load(
    store: &PgStore,
    t: &TenantId,
    worker: usize,
    started: &AtomicBool,
    stop: &AtomicBool,
) -> Vec<(String, Receipt, bool)> {
    let mut acked = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let k = format!("live-{worker}-{n}");
        n += 1;
        let f = fence(store, t, claim(&k, 1, binding("alice", 0))).await;
        let cmd = settle(&k, f, 1, binding("alice", 0), completed(2));
        let r = receipt(run(store, t, cmd).await);
        // Read after the acknowledgement: false means it came before the export began.
        acked.push((k, r, !started.load(Ordering::SeqCst)));
    }
    acked
}

#[tokio::test]
async fn a_live_export_holds_every_receipt_acknowledged_before_it() {
    let (store, _, _g) = common::store("prl").await;
    let store = Arc::new(store);
    let t = tenant("acme");
    // A base large enough that the export takes a while.
    let base = settled_base(&store, &t, 10).await;
    let started = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (store, t, started, stop) = (store.clone(), t.clone(), started.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            load(&store, &t, w, &started, &stop).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    started.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let (bytes, summary) = export_to(&*store, Vec::new(), |_, _| {}).await.unwrap();
    let took = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::SeqCst);
    let mut acked = Vec::new();
    for w in workers {
        acked.extend(w.await.unwrap());
    }

    assert_eq!(settle_portable::verify(&bytes[..]).unwrap(), summary);
    let reader = Reader::new(&bytes[..]).unwrap();
    let header_floor = reader.header().fence_floor;
    let mut seen = HashSet::new();
    let mut receipts: HashMap<String, Option<Receipt>> = HashMap::new();
    for e in reader {
        let e = e.unwrap();
        let (s, tn, n) = e.order();
        assert!(
            seen.insert((s, tn.to_string(), n.to_string())),
            "twice: {n}"
        );
        if let Entity::Record { record, .. } = e {
            receipts.insert(record.key.as_str().to_string(), record.receipt);
        }
    }
    assert!(
        header_floor > summary.max_fence,
        "the header's floor is above every fence in it"
    );
    let before: Vec<_> = acked.iter().filter(|a| a.2).collect();
    for (k, r) in base
        .iter()
        .map(|(k, r)| (k, r))
        .chain(before.iter().map(|(k, r, _)| (k, r)))
    {
        assert_eq!(
            receipts.get(k),
            Some(&Some(r.clone())),
            "{k} acknowledged before the export"
        );
    }
    let during = acked.len() - before.len();
    eprintln!(
        "live export: {} entities in {took:?}; {} receipts acknowledged before it, {during} after it began",
        summary.records,
        before.len()
    );
    assert!(!before.is_empty());
}

#[tokio::test]
async fn the_export_is_in_bytewise_order_whatever_the_collation() {
    let (store, _, _g) = common::store("prc").await;
    let s = store.schema().to_string();
    // A collation that is not bytewise ("a" < "B", "a_b" < "a-b"), as a
    // database created with a language's locale would have.
    let c = side_client().await;
    c.batch_execute(&format!(
        "ALTER TABLE \"{s}\".settle_records ALTER COLUMN tenant TYPE text COLLATE \"en-x-icu\", \
           ALTER COLUMN key TYPE text COLLATE \"en-x-icu\"; \
         ALTER TABLE \"{s}\".settle_principals ALTER COLUMN tenant TYPE text COLLATE \"en-x-icu\", \
           ALTER COLUMN principal TYPE text COLLATE \"en-x-icu\"; \
         ALTER TABLE \"{s}\".settle_warnings ALTER COLUMN tenant TYPE text COLLATE \"en-x-icu\", \
           ALTER COLUMN task TYPE text COLLATE \"en-x-icu\""
    ))
    .await
    .unwrap();
    let names = ["B", "a", "a-b", "a_b", "Z", "b"];
    for t in ["B", "a"] {
        let t = tenant(t);
        for n in names {
            fence(&store, &t, claim(n, 1, binding("alice", 0))).await;
            run(&store, &t, revoke(n)).await;
            run(
                &store,
                &t,
                Command::Warn(Warn {
                    task: TaskId::new(n).unwrap(),
                    class: WarningClass::new("c").unwrap(),
                    detail: None,
                }),
            )
            .await;
        }
    }
    // The premise: the database's own order differs from the bytewise one.
    let db: Vec<(String, String)> = c
        .query(
            &format!("SELECT tenant, key FROM \"{s}\".settle_records ORDER BY tenant, key"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut bytewise = db.clone();
    bytewise.sort();
    assert_ne!(db, bytewise);

    let (bytes, summary) = export_to(&store, Vec::new(), |_, _| {}).await.unwrap();
    assert_eq!(
        (summary.records, summary.principals, summary.warning_tasks),
        (12, 12, 12)
    );
    let order: Vec<(u8, String, String)> = Reader::new(&bytes[..])
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let (s, t, n) = e.order();
            (s, t.to_string(), n.to_string())
        })
        .collect();
    let mut want = order.clone();
    want.sort();
    assert_eq!(order, want);
    let records: Vec<(String, String)> = order
        .iter()
        .filter(|o| o.0 == 0)
        .map(|o| (o.1.clone(), o.2.clone()))
        .collect();
    assert_eq!(records, bytewise);
    assert_eq!(
        records
            .iter()
            .filter(|r| r.0 == "B")
            .map(|r| r.1.as_str())
            .collect::<Vec<_>>(),
        ["B", "Z", "a", "a-b", "a_b", "b"]
    );
}

/// Export and import rates on a larger store (`SETTLE_PORTABLE_N` records,
/// 100,000 by default): a file made from an in-memory store is imported,
/// then exported again from PostgreSQL.
#[tokio::test]
#[ignore = "a measurement: cargo test -p settle-pg --test portable -- --ignored --nocapture"]
async fn export_and_import_rates() {
    let n: usize = std::env::var("SETTLE_PORTABLE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let mem = MemStore::default();
    let t = tenant("acme");
    for i in 0..n {
        let k = format!("k{i:08}");
        let f = fence(&mem, &t, claim(&k, 1, binding("alice", 0))).await;
        run(
            &mem,
            &t,
            settle(&k, f, 1, binding("alice", 0), completed(1)),
        )
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    export_file(&mem, &a).await;
    let t0 = Instant::now();
    settle_portable::verify(std::io::BufReader::new(std::fs::File::open(&a).unwrap())).unwrap();
    let verified = t0.elapsed();
    let schema = unique_schema("prr");
    let _g = SchemaGuard::new(&url(), &schema);
    let t0 = Instant::now();
    let report = import(
        &url(),
        options(&schema, Clock::system()),
        &a,
        MARGIN,
        |_, _| {},
    )
    .await
    .unwrap();
    let imported = t0.elapsed();
    let store = PgStore::connect(&url(), options(&schema, Clock::system()))
        .await
        .unwrap();
    let t0 = Instant::now();
    let again = export_file(&store, &b).await;
    let exported = t0.elapsed();
    assert_eq!(again.tenants, report.summary.tenants);
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    eprintln!("verifying the file alone: {verified:?}");
    eprintln!(
        "{n} records, {} bytes: import {imported:?} ({:.0} records/s, verification included), \
         export {exported:?} ({:.0} records/s)",
        report.summary.bytes,
        rate(imported),
        rate(exported)
    );
}

#[tokio::test]
async fn a_row_that_does_not_decode_ends_the_export_with_an_error() {
    let (store, _, _g) = common::store("prd").await;
    let t = tenant("acme");
    for k in ["a", "b", "c"] {
        fence(&store, &t, claim(k, 1, binding("alice", 0))).await;
    }
    side_client()
        .await
        .execute(
            &format!(
                "UPDATE \"{}\".settle_records SET value = '\\xffff' WHERE key = 'b'",
                store.schema()
            ),
            &[],
        )
        .await
        .unwrap();
    let r = export_to(&store, Vec::new(), |_, _| {}).await;
    assert!(
        matches!(&r, Err(ExportError::Store(StoreError::Corrupt(m))) if m.contains("\"b\"")),
        "{r:?}"
    );
}

#[tokio::test]
async fn an_import_cut_short_leaves_the_target_empty() {
    let mem = MemStore::default();
    let t = tenant("acme");
    for i in 0..20_000 {
        let k = format!("k{i:06}");
        let f = fence(&mem, &t, claim(&k, 1, binding("alice", 0))).await;
        run(
            &mem,
            &t,
            settle(&k, f, 1, binding("alice", 0), completed(1)),
        )
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big");
    let summary = export_file(&mem, &file).await;
    let (target, _g) = empty_target("prk").await;
    let schema = target.schema().to_string();

    // The importer's session ends (as if the importer were killed) once
    // some batches are in.
    let batches = Arc::new(tokio::sync::Notify::new());
    let killer = {
        let (batches, schema) = (batches.clone(), schema.clone());
        tokio::spawn(async move {
            batches.notified().await;
            let side = side_client().await;
            common::terminate_store_backends(&side, &schema).await
        })
    };
    let mut seen = 0;
    let r = import(
        &url(),
        options(&schema, Clock::system()),
        &file,
        MARGIN,
        |n, _| {
            seen = n;
            if n >= 3 * settle_ledger::export::CHUNK as u64 {
                batches.notify_one();
            }
        },
    )
    .await;
    assert!(!killer.await.unwrap().is_empty());
    assert!(matches!(r, Err(ImportError::Store(_))), "{r:?}");
    assert!(seen > 0 && seen < summary.records, "{seen}");
    assert_eq!(rows(&schema).await, (0, 0, 0));
    assert_eq!(target.fence_floor().await.unwrap(), 1);

    // A future dropped midway (the importer's task cancelled) writes nothing either.
    let some_in = tokio::sync::Notify::new();
    let db = url();
    let cut = import(
        &db,
        options(&schema, Clock::system()),
        &file,
        MARGIN,
        |n, _| {
            if n >= 2 * settle_ledger::export::CHUNK as u64 {
                some_in.notify_one();
            }
        },
    );
    tokio::select! {
        r = cut => panic!("the import finished before it was dropped: {r:?}"),
        () = some_in.notified() => {}
    }
    assert_eq!(rows(&schema).await, (0, 0, 0));

    // The whole file then goes in.
    let report = import(
        &url(),
        options(&schema, Clock::system()),
        &file,
        MARGIN,
        |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!(rows(&schema).await, (20_000, 0, 0));
    assert_eq!(report.fence_floor, summary.import_floor(MARGIN).unwrap());
}
