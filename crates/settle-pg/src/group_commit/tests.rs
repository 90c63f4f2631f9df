//! The write statements (`batch_write`, and `batch_write_one`'s one
//! per operation) against a real schema: they must make exactly the
//! same checks, since which one runs depends only on the batch's size
//! and its one operation.
use super::write::stale;
use super::*;
use crate::session::Token;
use crate::sql::{BATCH_WRITE_TYPES, WARM_WRITE_TYPES};
use crate::{PgOptions, PgStore};
use settle_core::ClaimDecision;
use settle_ledger::Store as _;
use tokio_postgres::types::ToSql;

fn url() -> String {
    std::env::var("SETTLE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// What a one-round-trip write checks besides the batch write's
/// (`sql::warm_check`): the principal rows as known (tenant, name,
/// generation, moved_at, moves), the clock estimate (`None`: the
/// database clock read just before) and the fence block's last fence.
#[derive(Default)]
struct Warm {
    principals: Vec<(
        &'static str,
        &'static str,
        Option<&'static str>,
        Option<i64>,
    )>,
    est: Option<i64>,
    fences_last: Option<i64>,
}

/// One row's write as the statements take it (arrays of one), with a
/// fresh commit token; with `warm`, a one-round-trip statement.
async fn write_with(
    c: &tokio_postgres::Client,
    sql: &str,
    key: &str,
    op: &str,
    v: Option<&str>,
    deadline: i64,
    warm: Option<&Warm>,
) -> Result<i64, tokio_postgres::Error> {
    let st = match warm {
        Some(_) => c.prepare_typed(sql, &WARM_WRITE_TYPES).await?,
        None => c.prepare_typed(sql, &BATCH_WRITE_TYPES).await?,
    };
    let token = Token::new(1);
    let token_bytes: &[u8] = &token.bytes;
    let (t, k, o) = (vec!["acme"], vec![key], vec![op]);
    let v: Vec<Option<&str>> = vec![v];
    let (f, val): (Vec<Option<i16>>, Vec<Option<Vec<u8>>>) = if op == "d" {
        (vec![None], vec![None])
    } else {
        (vec![Some(2)], vec![Some(vec![1, 2, 3])])
    };
    let owner: Vec<Option<&str>> = vec![Some("p")];
    let status: Vec<Option<i16>> = vec![Some(0)];
    let b: Vec<Option<bool>> = vec![Some(false)];
    let n: Vec<Option<i64>> = vec![Some(5)];
    let g: Vec<Option<&str>> = vec![Some("0")];
    let none: Vec<Option<i64>> = vec![None];
    let expected = 1i64;
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &t,
        &k,
        &o,
        &v,
        &f,
        &val,
        &owner,
        &status,
        &b,
        &n,
        &g,
        &n,
        &none,
        &none,
        &b,
        &deadline,
        &expected,
        &token.at,
        &token_bytes,
    ];
    let ps: &[_] = warm.map_or(&[], |w| &w.principals[..]);
    let pt: Vec<&str> = ps.iter().map(|p| p.0).collect();
    let pn: Vec<&str> = ps.iter().map(|p| p.1).collect();
    let pg: Vec<Option<&str>> = ps.iter().map(|p| p.2).collect();
    let pm: Vec<Option<i64>> = ps.iter().map(|p| p.3).collect();
    let pv: Vec<Option<Vec<u8>>> = ps.iter().map(|_| None).collect();
    let est: i64 = match warm {
        Some(Warm { est: Some(e), .. }) => *e,
        _ => c
            .query_one(&format!("SELECT {}", crate::sql::NOW_MS), &[])
            .await?
            .get(0),
    };
    let last = warm.and_then(|w| w.fences_last);
    if warm.is_some() {
        params.extend([&pt as &(dyn ToSql + Sync), &pn, &pg, &pm, &pv, &est, &last]);
    }
    Ok(c.query_one(&st, &params).await?.get(0))
}

async fn write(
    c: &tokio_postgres::Client,
    sql: &str,
    key: &str,
    op: &str,
    v: Option<&str>,
    deadline: i64,
) -> Result<i64, tokio_postgres::Error> {
    write_with(c, sql, key, op, v, deadline, None).await
}

async fn xmin(c: &tokio_postgres::Client, schema: &str, key: &str) -> Option<String> {
    c.query_opt(
        &format!("SELECT xmin::text FROM \"{schema}\".settle_records WHERE key = $1"),
        &[&key],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// Drops the test's schema, also when the test fails.
struct DropSchema(String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let schema = self.0.clone();
        // Drop runs inside the test's runtime: clean up from a thread.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (c, task) = tokio_postgres::connect(&url(), tokio_postgres::NoTls).await?;
                tokio::spawn(task);
                c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}", self.0);
        }
    }
}

fn is_stale(r: Result<i64, tokio_postgres::Error>) -> bool {
    r.as_ref().is_err_and(stale)
}

/// A fresh store in its own schema, dropped at the end of the test.
async fn scratch(tag: &str) -> (PgStore, DropSchema) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let schema = format!("t_{tag}_{}_{nanos}", std::process::id());
    let drop = DropSchema(schema.clone());
    let store = PgStore::connect(
        &url(),
        PgOptions {
            schema,
            ..PgOptions::default()
        },
    )
    .await
    .expect("a PostgreSQL server (SETTLE_TEST_PG_URL)");
    (store, drop)
}

/// A batch with a command on this key panics (see `run`).
pub(super) const PANIC_KEY: &str = "test-this-batch-panics";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_panics_fails_its_callers_and_group_commit_goes_on() {
    use settle_core::testkit::{binding, claim};
    let (store, _guard) = scratch("gcp").await;
    let tenant = TenantId::new("acme").unwrap();
    let r = store
        .execute(&tenant, claim(PANIC_KEY, 1, binding("alice", 0)))
        .await;
    assert!(matches!(r, Err(StoreError::Closed)), "{r:?}");
    // The worker survived: a later claim is granted (a dead worker
    // would leave it waiting forever, hence the deadline).
    for i in 0..3 {
        let cmd = claim(&format!("after-{i}"), 1, binding("alice", 0));
        let r = tokio::time::timeout(Duration::from_secs(20), store.execute(&tenant, cmd))
            .await
            .expect("group commit stopped after a panic");
        assert!(
            matches!(r, Ok(Reply::Claim(ClaimDecision::Execute(_)))),
            "{r:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_load_statements_read_the_same_things() {
    let (store, guard) = scratch("gcl").await;
    let schema = guard.0.clone();
    let sql = &store.inner.sql;
    let conn = store.inner.pool.get().await.unwrap();
    let c: &tokio_postgres::Client = &conn;
    c.batch_execute(&format!(
        "INSERT INTO \"{schema}\".settle_principals VALUES ('acme', 'alice', 3, 5, '\\x0102'); \
         INSERT INTO \"{schema}\".settle_records (tenant, key, format, value) \
           VALUES ('acme', 'k', 2, '\\x010203'), ('acme', 'other', 2, '\\x04')"
    ))
    .await
    .unwrap();
    let many = c.prepare(&sql.batch_load).await.unwrap();
    let one = c.prepare(&sql.batch_load_one).await.unwrap();
    // Everything but the clock and the fences' values (each read takes new ones).
    let read = async |st: &tokio_postgres::Statement, key: &str, principal: &str, fences: i32| {
        let (t, k, p) = (vec!["acme"], vec![key], vec![principal]);
        let params: [&(dyn ToSql + Sync); 5] = [&t, &k, &fences, &t, &p];
        let rows = c.query(st, &params).await.unwrap();
        rows.iter()
            .map(|r| {
                let fences: Vec<i64> = r.get(2);
                format!(
                    "{:?} {} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
                    r.get::<_, String>(1),
                    fences.len(),
                    r.get::<_, Option<Vec<String>>>(3),
                    r.get::<_, Option<Vec<String>>>(4),
                    r.get::<_, Option<Vec<Option<String>>>>(5),
                    r.get::<_, Option<Vec<Option<i64>>>>(6),
                    r.get::<_, Option<String>>(7),
                    r.get::<_, Option<String>>(8),
                    r.get::<_, Option<i16>>(9),
                    r.get::<_, Option<Vec<u8>>>(10),
                    r.get::<_, Option<String>>(11),
                    r.get::<_, Option<Vec<Option<Vec<u8>>>>>(12),
                )
            })
            .collect::<Vec<_>>()
    };
    for (key, principal, fences) in [
        ("k", "alice", 1),
        ("k", "bob", 0),
        ("absent", "alice", 2),
        ("absent", "bob", 1),
    ] {
        let a = read(&many, key, principal, fences).await;
        let b = read(&one, key, principal, fences).await;
        assert_eq!(a.len(), 1, "{key} {principal}: one row");
        assert_eq!(a, b, "{key} {principal}");
        // The rows say what is there (so that equal means something).
        assert_eq!(a[0].contains("\"alice\""), principal == "alice", "{}", a[0]);
        assert_eq!(a[0].contains("[1, 2, 3]"), key == "k", "{}", a[0]);
        assert!(!a[0].contains("[4]"), "{}", a[0]);
    }
    drop(conn);
    store.close();
}

/// Each check the one-round-trip write makes beyond the batch write's
/// (`sql::warm_check`), one at a time: a write decided on anything
/// but what is there now writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_one_round_trip_write_checks_what_it_was_decided_on() {
    let (store, guard) = scratch("gcwarm").await;
    let schema = guard.0.clone();
    let sql = &store.inner.sql;
    let conn = store.inner.pool.get().await.unwrap();
    let c: &tokio_postgres::Client = &conn;
    let now: i64 = c.query_one(sql.now.as_str(), &[]).await.unwrap().get(0);
    let open = now + 60_000;
    let insert = sql.warm_write_one.of("i");
    let mut n = 0;
    let mut attempt = |w: Warm| {
        n += 1;
        let key = format!("k{n}");
        async move {
            let r = write_with(c, insert, &key, "i", None, open, Some(&w)).await;
            (r, key)
        }
    };
    let written = |r: Result<i64, tokio_postgres::Error>| matches!(r, Ok(1));
    // Nothing to check: written.
    assert!(written(attempt(Warm::default()).await.0));
    // The clock estimate ahead of the clock, or too far behind it.
    let ahead = Warm {
        est: Some(now + 60_000),
        ..Warm::default()
    };
    assert!(is_stale(attempt(ahead).await.0));
    let behind = Warm {
        est: Some(now - 60_000),
        ..Warm::default()
    };
    assert!(is_stale(attempt(behind).await.0));
    // A principal as known: no row, or its row as it is.
    let absent = Warm {
        principals: vec![("acme", "alice", None, None)],
        ..Warm::default()
    };
    assert!(written(attempt(absent).await.0));
    c.batch_execute(&format!(
        "INSERT INTO \"{schema}\".settle_principals (tenant, principal, generation, moved_at) \
         VALUES ('acme', 'alice', 2, 5)"
    ))
    .await
    .unwrap();
    let stale_absent = Warm {
        principals: vec![("acme", "alice", None, None)],
        ..Warm::default()
    };
    assert!(is_stale(attempt(stale_absent).await.0));
    let stale_generation = Warm {
        principals: vec![("acme", "alice", Some("1"), Some(5))],
        ..Warm::default()
    };
    assert!(is_stale(attempt(stale_generation).await.0));
    let stale_moved = Warm {
        principals: vec![("acme", "alice", Some("2"), Some(4))],
        ..Warm::default()
    };
    assert!(is_stale(attempt(stale_moved).await.0));
    let current = Warm {
        principals: vec![("acme", "alice", Some("2"), Some(5))],
        ..Warm::default()
    };
    assert!(written(attempt(current).await.0));
    // Fences: the block must end at the sequence's last value.
    let last: i64 = c
        .query_one(&format!("SELECT nextval('\"{schema}\".settle_fence')"), &[])
        .await
        .unwrap()
        .get(0);
    let drawn_since = Warm {
        fences_last: Some(last - 1),
        ..Warm::default()
    };
    assert!(is_stale(attempt(drawn_since).await.0));
    let block = Warm {
        fences_last: Some(last),
        ..Warm::default()
    };
    assert!(written(attempt(block).await.0));
    // Not durable: refused (the pipelined settings make it so on the
    // path itself; here the session's own setting stands).
    c.batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let (r, key) = attempt(Warm::default()).await;
    assert!(is_stale(r));
    assert_eq!(xmin(c, &schema, &key).await, None);
    c.batch_execute("RESET synchronous_commit").await.unwrap();
    drop(conn);
    store.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_write_statements_check_the_same_things() {
    let (store, guard) = scratch("gcw").await;
    let schema = guard.0.clone();
    let sql = &store.inner.sql;
    let conn = store.inner.pool.get().await.unwrap();
    let c: &tokio_postgres::Client = &conn;
    let now: i64 = c.query_one(sql.now.as_str(), &[]).await.unwrap().get(0);
    let open = now + 60_000;
    // The statement a batch of many (or of one) runs for `op`, on the
    // two-round-trip path or (`warm`) the one-round-trip path.
    fn statement<'a>(sql: &'a crate::sql::Sql, many: bool, warm: bool, op: &str) -> &'a str {
        match (many, warm) {
            (true, false) => &sql.batch_write,
            (false, false) => sql.batch_write_one.of(op),
            (true, true) => &sql.warm_write,
            (false, true) => sql.warm_write_one.of(op),
        }
    }
    let one = |op| statement(sql, false, false, op);
    // The one-round-trip statements with nothing more to check (no
    // principal, the clock as it is, no fence) check what the others do.
    let neutral = Warm::default();
    for (name, many, warm) in [
        ("many", true, None),
        ("one", false, None),
        ("warm-many", true, Some(&neutral)),
        ("warm-one", false, Some(&neutral)),
    ] {
        let text = |op| statement(sql, many, warm.is_some(), op);
        let key = format!("k-{name}");
        // A new record: written, with its commit token.
        assert_eq!(
            write_with(c, text("i"), &key, "i", None, open, warm)
                .await
                .unwrap(),
            1,
            "{name}"
        );
        let v1 = xmin(c, &schema, &key).await.expect("inserted");
        // The key is taken: nothing written.
        assert!(
            is_stale(write_with(c, text("i"), &key, "i", None, open, warm).await),
            "{name}"
        );
        // Past the insert window: nothing written.
        let late = format!("late-{name}");
        assert!(
            is_stale(write_with(c, text("i"), &late, "i", None, now - 1, warm).await),
            "{name}"
        );
        assert_eq!(xmin(c, &schema, &late).await, None, "{name}");
        // Compare-and-set: a stale xmin writes nothing, the current one writes.
        assert!(
            is_stale(write_with(c, text("u"), &key, "u", Some("1"), open, warm).await),
            "{name}"
        );
        assert_eq!(xmin(c, &schema, &key).await.as_ref(), Some(&v1), "{name}");
        assert_eq!(
            write_with(c, text("u"), &key, "u", Some(&v1), open, warm)
                .await
                .unwrap(),
            1,
            "{name}"
        );
        let v2 = xmin(c, &schema, &key).await.expect("updated");
        assert_ne!(v1, v2, "{name}");
        assert!(
            is_stale(write_with(c, text("d"), &key, "d", Some(&v1), open, warm).await),
            "{name}"
        );
        assert_eq!(
            write_with(c, text("d"), &key, "d", Some(&v2), open, warm)
                .await
                .unwrap(),
            1,
            "{name}"
        );
        assert_eq!(xmin(c, &schema, &key).await, None, "{name}");
    }
    // A one-record statement run with another operation writes nothing.
    let key = "k-wrong-op".to_string();
    assert_eq!(write(c, one("i"), &key, "i", None, open).await.unwrap(), 1);
    let v = xmin(c, &schema, &key).await.expect("inserted");
    for (stmt, op) in [("u", "i"), ("u", "d"), ("d", "u"), ("i", "u")] {
        assert!(
            is_stale(write(c, one(stmt), &key, op, Some(&v), open).await),
            "the {stmt} statement with op {op}"
        );
        assert_eq!(xmin(c, &schema, &key).await.as_ref(), Some(&v));
    }
    // Every write that succeeded left its token, and only those: 4 × 3 + 1.
    let tokens: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM \"{schema}\".settle_commits"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tokens, 13);
    drop(conn);
    store.close();
}
