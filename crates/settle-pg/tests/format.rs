//! The frozen row encoding (record format 2, schema version 2) through a
//! real database: the fixture rows of `tests/fixtures/` (whose bytes
//! `src/format_tests.rs` pins to the expected core values) are inserted
//! into a fresh schema as the engine would have written them, then read
//! through the store: `get`, `warnings`, a claim against the principal row,
//! `stats` and the sweep over the derived columns.

mod common;

use std::path::PathBuf;

use common::acme;
use settle_core::testkit::*;
use settle_core::*;
use settle_ledger::Store;

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("fixture {}: {e}", p.display()))
}

/// `column=value` lines; `NULL` is SQL NULL.
fn columns(name: &str) -> Vec<(String, Option<String>)> {
    String::from_utf8(fixture(name))
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), (v != "NULL").then(|| v.to_string()))
        })
        .collect()
}

/// The fixtures' timestamps are counted from this instant (2025-11-30).
const T0: i64 = 1_764_460_800_000;

async fn insert_record(
    side: &tokio_postgres::Client,
    schema: &str,
    key: &str,
    base: &str,
    format: u8,
) {
    let cols = columns(&format!("{base}-columns-format{format}-schema2.txt"));
    let names: Vec<&str> = cols.iter().map(|(k, _)| k.as_str()).collect();
    // Every derived column is given as text and cast by the server to its
    // schema-2 type, exactly as stored.
    let values: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, (k, _))| format!("${}::text::{}", i + 4, sql_type(k)))
        .collect();
    let stmt = format!(
        "INSERT INTO \"{schema}\".settle_records (tenant, key, value, {}) VALUES ($1, $2, $3, {})",
        names.join(", "),
        values.join(", ")
    );
    let value = fixture(&format!("{base}-format{format}.bin"));
    let texts: Vec<Option<String>> = cols.into_iter().map(|(_, v)| v).collect();
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&"acme", &key, &value];
    for t in &texts {
        params.push(t);
    }
    side.execute(&stmt, &params).await.unwrap();
}

fn sql_type(column: &str) -> &'static str {
    match column {
        "format" | "status" => "smallint",
        "owner" => "text",
        "reconcile" | "disputed" => "boolean",
        "lease_generation" => "numeric",
        "lease_expires_at" | "updated_at" | "collect_at" | "receipt_at" => "bigint",
        other => panic!("a column schema 2 does not have: {other}"),
    }
}

/// A record as the bytes of `format` say (their decoding to the expected
/// values is pinned by the crate's format tests).
fn decoded(format: u8, bytes: &[u8]) -> Record {
    match format {
        2 => postcard::from_bytes::<settle_core::legacy::v2::Record>(bytes)
            .unwrap()
            .into(),
        _ => postcard::from_bytes(bytes).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_2_rows_are_read_by_this_build() {
    rows_are_read_by_this_build(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_3_rows_are_read_by_this_build() {
    rows_are_read_by_this_build(3).await;
}

async fn rows_are_read_by_this_build(format: u8) {
    let (store, clock, g) = common::store(&format!("format{format}")).await;
    let side = common::side_client().await;
    // The store's clock at T0 + 10 s: after every fixture timestamp, while
    // the open lease (until T0 + 33 s) runs and before any retention ends.
    let db_now = store.now().await.unwrap().millis() as i64;
    clock.advance(T0 + 10_000 - db_now);

    insert_record(&side, &g.schema, "order-1", "record", format).await;
    insert_record(&side, &g.schema, "order-2", "open-record", format).await;
    side.execute(
        &format!(
            "INSERT INTO \"{}\".settle_warnings (tenant, task, format, value) \
             VALUES ('acme', 'nightly-export', {format}, $1)",
            g.schema
        ),
        &[&fixture(&format!("warnings-format{format}.bin"))],
    )
    .await
    .unwrap();
    let p = columns("principal-columns-schema2.txt");
    side.execute(
        &format!(
            "INSERT INTO \"{}\".settle_principals (tenant, principal, generation, moved_at, moves) \
             VALUES ('acme', 'bob', $1::text::numeric, $2::text::bigint, $3)",
            g.schema
        ),
        &[
            &p[0].1,
            &p[1].1,
            &fixture(&format!("principal-moves-format{format}.bin")),
        ],
    )
    .await
    .unwrap();

    // Records and warnings read as the bytes say (their decoding to the
    // expected values is pinned by the crate's format tests).
    for (k, base) in [("order-1", "record"), ("order-2", "open-record")] {
        let want = decoded(format, &fixture(&format!("{base}-format{format}.bin")));
        assert_eq!(
            store.get(&acme(), &key(k)).await.unwrap(),
            Ok(Some(want)),
            "{k}"
        );
    }
    let want: Vec<Warning> =
        postcard::from_bytes(&fixture(&format!("warnings-format{format}.bin"))).unwrap();
    let task = TaskId::new("nightly-export").unwrap();
    assert_eq!(store.warnings(&acme(), &task).await.unwrap(), want);
    assert_eq!(want.len(), 2);

    // bob's row says generation 3: a binding at 2 is stale, at 3 it claims.
    assert_eq!(
        refused(
            &store
                .execute(&acme(), claim("new", 1, binding("bob", 2)))
                .await
                .unwrap()
        ),
        Some(RefusalCode::StaleBinding)
    );
    assert!(matches!(
        store
            .execute(&acme(), claim("new", 1, binding("bob", 3)))
            .await
            .unwrap(),
        Reply::Claim(ClaimDecision::Execute(_))
    ));

    // The derived columns, through the stats' and the sweep's SQL.
    let stats = store.stats(3_600_000).await.unwrap();
    assert_eq!((stats.open, stats.disputed, stats.undecodable), (2, 1, 0));
    // Past the open lease (T0 + 33 s): the sweep finds it by lease_expires_at.
    clock.advance(60_000);
    let report = store.sweep().await.unwrap();
    assert_eq!(report.expired, 2, "order-2's lease and the new claim's");
    // Past order-1's retention (7 days after T0 + 2 s): found by collect_at.
    clock.advance(7 * 86_400_000);
    assert_eq!(store.sweep().await.unwrap().collected, 1);
    assert_eq!(store.get(&acme(), &key("order-1")).await.unwrap(), Ok(None));
}
