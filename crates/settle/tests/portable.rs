//! `settle export`, `settle import` and `settle migrate` as a user runs
//! them (SPEC §12): round trips through files and between engines, the
//! `--json` summaries, refusals, and `settle import` killed at random points.
//!
//! The PostgreSQL cases need the test machine's server (`SETTLE_TEST_PG_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`); each uses a database
//! of its own.

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::pg::Database;
use common::{BIN, Server, TempDir};
use serde_json::Value;
use settle_core::testkit::{binding, claim, completed, revoke, settle};
use settle_core::{ClaimDecision, Reply, TenantId};
use settle_embedded::{EmbeddedOptions, EmbeddedStore};
use settle_ledger::Store;

fn settle_cmd(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// Runs `settle ARGS --json`, expects success, returns the JSON.
fn json(args: &[&str]) -> Value {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--json");
    let out = settle_cmd(&all);
    assert!(
        out.status.success(),
        "settle {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A stopped embedded store with `n` settled records in two tenants, one
/// open lease and a revoked principal.
async fn populate(dir: &Path, n: usize) {
    let store = EmbeddedStore::open(dir, EmbeddedOptions::default()).unwrap();
    for i in 0..n {
        let t = TenantId::new(if i % 2 == 0 { "acme" } else { "beta" }).unwrap();
        let k = format!("k{i:06}");
        let Reply::Claim(ClaimDecision::Execute(g)) = store
            .execute(&t, claim(&k, 1, binding("alice", 0)))
            .await
            .unwrap()
        else {
            panic!("claim {k}")
        };
        store
            .execute(
                &t,
                settle(&k, g.fence, 1, binding("alice", 0), completed(1)),
            )
            .await
            .unwrap();
    }
    let acme = TenantId::new("acme").unwrap();
    store
        .execute(&acme, claim("open", 2, binding("bob", 0)))
        .await
        .unwrap();
    store.execute(&acme, revoke("carol")).await.unwrap();
    store.close();
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort();
    k
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_through_a_file_on_the_embedded_engine() {
    let tmp = TempDir::new("portable");
    let a = tmp.path().join("a");
    populate(&a, 300).await;
    let file = tmp.path().join("a.settle");
    let exported = json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    assert_eq!(
        keys(&exported),
        [
            "bytes",
            "engine",
            "entities_per_s",
            "fence_floor",
            "fences_per_claim_max",
            "file",
            "max_fence",
            "principals",
            "records",
            "seconds",
            "sha256",
            "warning_tasks"
        ]
    );
    assert_eq!(exported["records"], 301);
    assert_eq!(exported["principals"], 1);
    assert_eq!(exported["engine"], "embedded");
    assert_eq!(exported["fences_per_claim_max"], 1);
    assert!(!Path::new(&format!("{}.partial", file.display())).exists());

    let b = tmp.path().join("b");
    let imported = json(&[
        "import",
        "--from",
        file.to_str().unwrap(),
        "--data",
        b.to_str().unwrap(),
    ]);
    assert_eq!(imported["records"], 301);
    assert_eq!(imported["fence_margin"], 1_000_000_000);
    assert_eq!(
        imported["claims_covered"], 1_000_000_000,
        "one fence per claim"
    );
    let floor = imported["target_fence_floor"].as_u64().unwrap();
    assert!(
        floor > 1_000_000_000,
        "the default margin is added: {floor}"
    );
    let again = tmp.path().join("b.settle");
    let reexported = json(&[
        "export",
        "--data",
        b.to_str().unwrap(),
        "--to",
        again.to_str().unwrap(),
    ]);
    assert_eq!(reexported["records"], exported["records"]);
    let entities = |f: &Path| {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines[1..lines.len() - 1].to_vec()
    };
    assert_eq!(
        entities(&again),
        entities(&file),
        "the same entities, byte for byte"
    );
    let check = settle_cmd(&["check", "--data", b.to_str().unwrap()]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_write_nothing() {
    let tmp = TempDir::new("refusals");
    let a = tmp.path().join("a");
    populate(&a, 20).await;
    let file = tmp.path().join("a.settle");
    json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    // A second export to the same file is refused, the file untouched.
    let before = std::fs::read(&file).unwrap();
    let out = settle_cmd(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
    assert_eq!(std::fs::read(&file).unwrap(), before);

    // Into a store that holds data: refused, nothing written.
    let out = settle_cmd(&[
        "import",
        "--from",
        file.to_str().unwrap(),
        "--data",
        a.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));

    // A damaged file: refused with its offset, no target made.
    let mut damaged = before.clone();
    let at = damaged.len() / 3;
    damaged[at] ^= 0x04;
    let bad = tmp.path().join("bad.settle");
    std::fs::write(&bad, damaged).unwrap();
    let c = tmp.path().join("c");
    let out = settle_cmd(&[
        "import",
        "--from",
        bad.to_str().unwrap(),
        "--data",
        c.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("damaged at byte"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!c.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_to_postgresql_and_back_keeps_every_tenants_digest() {
    let tmp = TempDir::new("migrate");
    let a = tmp.path().join("a");
    populate(&a, 200).await;
    let db = Database::create().await;
    let url = db.url();
    let there = json(&[
        "migrate",
        "--from-data",
        a.to_str().unwrap(),
        "--to-store",
        &url,
    ]);
    assert_eq!(there["checked"], true);
    assert_eq!(there["records"], 201);
    assert_eq!(there["tenants"], 2);
    // Into a database that now holds data: refused.
    let out = settle_cmd(&[
        "migrate",
        "--from-data",
        a.to_str().unwrap(),
        "--to-store",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));

    let b = tmp.path().join("b");
    let back = json(&[
        "migrate",
        "--from-store",
        &url,
        "--to-data",
        b.to_str().unwrap(),
    ]);
    assert_eq!(back["checked"], true);
    assert_eq!(back["records"], 201);
    let fa = tmp.path().join("a.settle");
    let fb = tmp.path().join("b.settle");
    let ea = json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        fa.to_str().unwrap(),
    ]);
    json(&[
        "export",
        "--data",
        b.to_str().unwrap(),
        "--to",
        fb.to_str().unwrap(),
    ]);
    let body = |f: &Path| {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines[1..lines.len() - 1].to_vec()
    };
    assert_eq!(body(&fa), body(&fb));
    // The PostgreSQL store's next fence is past the margin.
    let pg = json(&[
        "export",
        "--store",
        &url,
        "--to",
        tmp.path().join("pg.settle").to_str().unwrap(),
    ]);
    assert_eq!(pg["engine"], "postgres");
    assert!(
        pg["fence_floor"].as_u64().unwrap() > ea["max_fence"].as_u64().unwrap() + 1_000_000_000
    );
}

/// `lines` (the JSON texts of a file, header first) framed and the
/// trailer's digest recomputed: an edited file re-signed, every checksum
/// good.
fn resigned(lines: &[String]) -> Vec<u8> {
    use sha2::Digest as _;
    let frame = |j: &str| format!("{:08x} {j}\n", crc32fast::hash(j.as_bytes()));
    let mut out = String::new();
    for l in &lines[..lines.len() - 1] {
        out.push_str(&frame(l));
    }
    let trailer = &lines[lines.len() - 1];
    let t: Value = serde_json::from_str(trailer).unwrap();
    let digest = hex::encode(sha2::Sha256::digest(out.as_bytes()));
    out.push_str(&frame(
        &trailer.replace(t["sha256"].as_str().unwrap(), &digest),
    ));
    out.into_bytes()
}

/// Edited copies of the export `text` (re-signed), each with what import
/// must say about it ("" for the unchanged one, which imports).
fn untrusted_files(text: &str) -> Vec<(&'static str, Vec<u8>, String)> {
    let lines: Vec<String> = text.lines().map(|l| l[9..].to_string()).collect();
    let at = |n: usize| -> usize { text.lines().take(n).map(|l| l.len() + 1).sum() };
    let edited = |n: usize, from: &str, to: &str| {
        let mut l = lines.clone();
        assert!(l[n].contains(from), "line {n} holds {from}: {}", l[n]);
        l[n] = l[n].replacen(from, to, 1);
        resigned(&l)
    };
    let principal = lines
        .iter()
        .position(|l| l.contains("\"kind\":\"principal\""))
        .unwrap();
    let floor = serde_json::from_str::<Value>(&lines[0]).unwrap()["fence_floor"].to_string();
    // Line 1: acme/k000000 (fence 1); line 2: acme/k000002 (fence 3).
    let mut shared = lines.clone();
    shared[2] = shared[2].replace("\"fence\":3,", "\"fence\":1,");
    vec![
        ("resigned unchanged", resigned(&lines), String::new()),
        (
            "a completed record without its receipt",
            edited(
                1,
                "\"status\":\"completed\",\"outcome\"",
                "\"status\":\"pending\",\"outcome\"",
            ),
            format!(
                "damaged at byte {}: record acme/k000000 breaks an invariant: terminal-has-receipt",
                at(1)
            ),
        ),
        (
            "two records sharing fence 1",
            resigned(&shared),
            format!(
                "damaged at byte {}: record acme/k000002 holds fence 1",
                at(2)
            ),
        ),
        (
            "a principal with 200 moves",
            edited(principal, "\"moves_len\":1", "\"moves_len\":200"),
            "bounded-moves".into(),
        ),
        (
            "an unknown engine",
            edited(0, "\"engine\":\"embedded\"", "\"engine\":\"whatever\""),
            "damaged at byte 0: the header's engine \"whatever\"".into(),
        ),
        (
            "a fence floor past 2^53 - 1 - 2^32",
            edited(
                0,
                &format!("\"fence_floor\":{floor}"),
                "\"fence_floor\":9007199254740991",
            ),
            "pass the highest fence floor allowed, 2^53 - 1 - 2^32".into(),
        ),
    ]
}

/// SPEC §12 "What import trusts": a re-signed file that is not a store,
/// and a fence floor out of bounds, are refused by name before anything is
/// written, on both engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_what_it_cannot_trust_on_both_engines() {
    let tmp = TempDir::new("trust");
    let a = tmp.path().join("a");
    populate(&a, 4).await;
    let file = tmp.path().join("a.settle");
    json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&file).unwrap();
    let db = Database::create().await;
    let url = db.url();
    for (i, (what, bytes, want)) in untrusted_files(&text).iter().enumerate() {
        let f = tmp.path().join(format!("case-{i}.settle"));
        std::fs::write(&f, bytes).unwrap();
        let target = tmp.path().join(format!("target-{i}"));
        let out = settle_cmd(&[
            "import",
            "--from",
            f.to_str().unwrap(),
            "--data",
            target.to_str().unwrap(),
        ]);
        if want.is_empty() {
            assert!(
                out.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            continue;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains(want.as_str()), "{what}: {err}");
        assert!(!target.exists(), "{what}: nothing written");
        let out = settle_cmd(&["import", "--from", f.to_str().unwrap(), "--store", &url]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what} (PostgreSQL): {err}");
        assert!(err.contains(want.as_str()), "{what} (PostgreSQL): {err}");
    }
    // Nothing reached the database: an export of it holds no record.
    let empty = json(&[
        "export",
        "--store",
        &url,
        "--to",
        tmp.path().join("pg.settle").to_str().unwrap(),
    ]);
    assert_eq!(empty["records"], 0);
}

/// `--fence-margin` is bounded (2^50) before any work, and the output
/// says how many claims it covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_margin_is_bounded_and_explained() {
    let tmp = TempDir::new("margin");
    let a = tmp.path().join("a");
    populate(&a, 2).await;
    let file = tmp.path().join("a.settle");
    json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    // Over the bound: clap refuses it (usage, 2), nothing made.
    for margin in ["18446744073709551615", "1125899906842625"] {
        let target = tmp.path().join("wrapped");
        let out = settle_cmd(&[
            "import",
            "--from",
            file.to_str().unwrap(),
            "--data",
            target.to_str().unwrap(),
            "--fence-margin",
            margin,
        ]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!target.exists());
    }
    // 2^50 itself is taken.
    let b = tmp.path().join("b");
    let v = json(&[
        "import",
        "--from",
        file.to_str().unwrap(),
        "--data",
        b.to_str().unwrap(),
        "--fence-margin",
        "1125899906842624",
    ]);
    assert_eq!(v["claims_covered"], 1u64 << 50);
    assert!(v["target_fence_floor"].as_u64().unwrap() > 1 << 50);
    // The summary line says it in words.
    let c = tmp.path().join("c");
    let out = settle_cmd(&[
        "import",
        "--from",
        file.to_str().unwrap(),
        "--data",
        c.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("covers at least 1000000000 claims made on the source after its snapshot"),
        "{said}"
    );
}

/// Every file the commands write is created exclusively, mode 0600: a
/// planted link at the partial name is never written through.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_are_private_and_never_written_through_a_link() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("exclusive");
    let a = tmp.path().join("a");
    populate(&a, 2).await;
    let file = tmp.path().join("a.settle");
    json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    // A link planted where the partial file goes: refused, its target untouched.
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    let to = tmp.path().join("b.settle");
    std::os::unix::fs::symlink(&victim, tmp.path().join("b.settle.partial")).unwrap();
    let out = settle_cmd(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        to.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    assert!(!to.exists());
    // A link at the final name: refused as well.
    std::os::unix::fs::symlink(&victim, tmp.path().join("c.settle")).unwrap();
    let out = settle_cmd(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        tmp.path().join("c.settle").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
}

/// `settle import` killed with SIGKILL at spread-out moments leaves either
/// no store (absent or empty, and a new import then succeeds) or the whole
/// one, never a partial store that opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_import_leaves_no_store_or_the_whole_one() {
    let tmp = TempDir::new("killimport");
    let a = tmp.path().join("a");
    populate(&a, 3_000).await;
    let file = tmp.path().join("a.settle");
    let exported = json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    // How long a whole import takes here: the kills are spread over it.
    let started = Instant::now();
    json(&[
        "import",
        "--from",
        file.to_str().unwrap(),
        "--data",
        tmp.path().join("timing").to_str().unwrap(),
    ]);
    let whole = started.elapsed();
    let (mut empty, mut complete) = (0, 0);
    for i in 0..8u32 {
        let target = tmp.path().join(format!("t{i}"));
        let mut child = Command::new(BIN)
            .args([
                "import",
                "--from",
                file.to_str().unwrap(),
                "--data",
                target.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A fault injected at a point in time, not a wait for something.
        std::thread::sleep(whole.mul_f64(f64::from(i) / 7.0) + Duration::from_millis(1));
        let _ = child.kill();
        child.wait().unwrap();
        let is_empty = !target.exists() || std::fs::read_dir(&target).unwrap().next().is_none();
        if is_empty {
            empty += 1;
            // Nothing usable: a new import into it goes through.
            json(&[
                "import",
                "--from",
                file.to_str().unwrap(),
                "--data",
                target.to_str().unwrap(),
            ]);
        } else {
            complete += 1;
        }
        let out = tmp.path().join(format!("t{i}.settle"));
        let again = json(&[
            "export",
            "--data",
            target.to_str().unwrap(),
            "--to",
            out.to_str().unwrap(),
        ]);
        assert_eq!(
            again["records"], exported["records"],
            "kill {i}: a partial store"
        );
        assert_eq!(again["principals"], exported["principals"]);
    }
    eprintln!("killed imports: {empty} left no store, {complete} a whole one");
}

/// The same on PostgreSQL: an import is one transaction, so a killed one
/// leaves the tables empty (a new import then goes through) or whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_import_into_postgresql_leaves_no_rows_or_all_of_them() {
    let tmp = TempDir::new("killpg");
    let a = tmp.path().join("a");
    populate(&a, 3_000).await;
    let file = tmp.path().join("a.settle");
    let exported = json(&[
        "export",
        "--data",
        a.to_str().unwrap(),
        "--to",
        file.to_str().unwrap(),
    ]);
    let timing = Database::create().await;
    let started = Instant::now();
    json(&[
        "import",
        "--from",
        file.to_str().unwrap(),
        "--store",
        &timing.url(),
    ]);
    let whole = started.elapsed();
    for i in 0..4u32 {
        let db = Database::create().await;
        let mut child = Command::new(BIN)
            .args([
                "import",
                "--from",
                file.to_str().unwrap(),
                "--store",
                &db.url(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A fault injected at a point in time, not a wait for something.
        std::thread::sleep(whole.mul_f64(f64::from(i) / 3.0) + Duration::from_millis(1));
        let _ = child.kill();
        let killed_early = !child.wait().unwrap().success();
        // The killed client's backend may still be finishing its COMMIT:
        // the store's state is final once its session is gone.
        db.await_no_sessions().await;
        let out = tmp.path().join(format!("pg{i}.settle"));
        let got = json(&[
            "export",
            "--store",
            &db.url(),
            "--to",
            out.to_str().unwrap(),
        ]);
        if got["records"] == 0 {
            assert!(killed_early, "kill {i}: a finished import left no rows");
            json(&[
                "import",
                "--from",
                file.to_str().unwrap(),
                "--store",
                &db.url(),
            ]);
        } else {
            assert_eq!(
                got["records"], exported["records"],
                "kill {i}: a partial import"
            );
            assert_eq!(got["principals"], exported["principals"]);
        }
    }
}

/// `settle export --data` (and `migrate --from-data`) on a store a running
/// server holds: refused, saying to stop the server first.
#[test]
fn exporting_a_served_store_says_to_stop_the_server_first() {
    let tmp = TempDir::new("served");
    let data = tmp.path().join("data");
    let _server = Server::start(&data, &[]);
    let to = tmp.path().join("a.settle");
    let out = settle_cmd(&[
        "export",
        "--data",
        data.to_str().unwrap(),
        "--to",
        to.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stop the server first"), "{err}");
    assert!(!to.exists());
}
