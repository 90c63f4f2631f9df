//! The CLI as a new user meets it: one clean line per
//! error, `inspect`/`check` sorted, limited
//! and telling what to do when the store is in use; and `settle bench
//! --store` on PostgreSQL.

mod common;

use std::process::{Command, Output};

use common::*;
use serde_json::Value;

fn settle(args: &[&str], url: &str) -> Output {
    Command::new(BIN)
        .args(args)
        .env("SETTLE_URL", url)
        .env_remove("SETTLE_TOKEN")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// `HTTP 409 stale_fence: stale_fence: …` became one line that names the
/// status and the code once.
#[tokio::test]
async fn errors_are_one_line_that_names_the_code_once() {
    let dir = TempDir::new("cli-errors");
    let s = Server::start(dir.path(), &[]);
    let f = fp(1);
    let id = ["--fingerprint", &f, "--principal", "svc", "--scope", "pay"];
    let out = settle(&[&["claim", "k"][..], &id].concat(), &s.url());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Another claim moves the store's fences on: fence 1 is stale for `k`.
    execute(&s.ep(), "other", 1, &binding("svc", 0)).await;
    let out = settle(&["heartbeat", "k", "--fence", "2"], &s.url());
    assert_eq!(out.status.code(), Some(5));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("refused (409 stale_fence): "), "{err}");
    assert_eq!(err.matches("stale_fence").count(), 1, "{err}");

    let out = settle(&["get", "missing"], &s.url());
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(
        stderr(&out).trim_end(),
        "rejected (404 not_found): no record for this key"
    );
    // A value no wire type has is refused as invalid (exit 4), as the
    // server would refuse it, before anything is sent.
    let out = settle(
        &[
            &["settle", "k", "--fence", "1", "--status", "done"][..],
            &id,
        ]
        .concat(),
        &s.url(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("error: invalid --status: "),
        "{}",
        stderr(&out)
    );
    // With --json the problem goes to stdout as the server sent it.
    let out = settle(&["get", "missing", "--json"], &s.url());
    assert_eq!(out.status.code(), Some(4));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], "not_found");
}

/// Fills a store with `n` settled keys through a server, then stops it.
async fn store_with_keys(dir: &std::path::Path, keys: &[&str]) {
    let mut s = Server::start(dir, &[]);
    let b = binding("svc", 0);
    for k in keys {
        let fence = execute(&s.ep(), k, 1, &b).await;
        let r = op(&s.ep(), k, "settle", settle_body(fence, 1, &b, unknown())).await;
        assert_eq!(r.status, 200, "{:?}", r.json());
    }
    assert!(s.terminate().success());
}

fn unknown() -> Value {
    serde_json::json!({"status": "unknown"})
}

#[tokio::test]
async fn inspect_lists_keys_sorted_and_limited() {
    let dir = TempDir::new("inspect-limit");
    store_with_keys(dir.path(), &["k3", "k1", "k5", "k2", "k4"]).await;
    let data = dir.path().to_str().unwrap();
    let out = settle(&["inspect", "--data", data, "--limit", "2"], "");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let unknown: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("unknown: 5"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    assert_eq!(
        unknown,
        [
            "default/k1",
            "default/k2",
            "… and 3 more (--limit N shows more, --json lists all)"
        ],
        "{text}"
    );
    // --json lists every key, sorted.
    let out = settle(&["inspect", "--json", "--data", data, "--limit", "2"], "");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let keys: Vec<&str> = v["unknown"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "default/k1",
            "default/k2",
            "default/k3",
            "default/k4",
            "default/k5"
        ]
    );
}

#[tokio::test]
async fn inspect_and_check_say_what_to_do_when_the_store_is_in_use() {
    let dir = TempDir::new("inspect-in-use");
    let _s = Server::start(dir.path(), &[]);
    let data = dir.path().to_str().unwrap();
    for cmd in ["inspect", "check"] {
        let out = settle(&[cmd, "--data", data], "");
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        let err = stderr(&out);
        assert!(
            err.contains("is in use: stop the server first, or use the live API"),
            "{cmd}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

fn pg_url() -> String {
    std::env::var("SETTLE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// `settle bench --store` runs both sides (the raw protocol and settle on
/// PostgreSQL), on scratch schemas it drops; `--only` runs one.
#[tokio::test]
async fn bench_on_postgres_compares_with_the_raw_protocol() {
    let url = pg_url();
    let args = [
        "bench",
        "--store",
        &url,
        "--concurrency",
        "2",
        "--duration",
        "0.3",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--json",
    ];
    let out = settle(&args, "");
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "postgres");
    assert!(v["pairs"].as_u64().unwrap() > 0, "{v}");
    assert!(v["baseline"]["pairs"].as_u64().unwrap() > 0, "{v}");
    assert!(v["ratio"].as_f64().unwrap() > 0.0, "{v}");

    let out = settle(
        &[&args[..], &["--only", "settle", "--group-commit", "off"]].concat(),
        "",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["pairs"].as_u64().unwrap() > 0, "{v}");
    assert!(v["baseline"].is_null() && v["ratio"].is_null(), "{v}");

    // A database that does not answer is one error line, not a panic.
    let out = settle(
        &[
            "bench",
            "--store",
            "postgres://postgres@127.0.0.1:1/test",
            "--duration",
            "0.1",
            "--warmup",
            "0",
            "--concurrency",
            "1",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with("error: ") && !err.contains("panicked"),
        "{err}"
    );
}

/// The start-up log says whether authentication is on, and for how many
/// tenants; with none configured it warns that it is off. It also says who
/// may call the admin endpoints.
#[test]
fn the_start_up_log_says_whether_authentication_is_on() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let start = |tenants: &[String], admin: &[String]| {
        let dir = TempDir::new("cli-auth-log");
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path())
            .env_remove("SETTLE_TENANTS")
            .env_remove("SETTLE_CONFIG")
            .env_remove("SETTLE_ADMIN_TOKEN_SHA256")
            .env("SETTLE_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for t in tenants {
            cmd.args(["--tenant", t]);
        }
        for a in admin {
            cmd.args(["--admin-token-sha256", a]);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("listening on "), "{line:?}");
        // The line is logged before `listening on` is printed.
        child.kill().unwrap();
        child.wait().unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        err
    };
    let two = [
        format!("acme={}", token_sha256("tok-a")),
        format!("beta={}", token_sha256("tok-b")),
    ];
    let err = start(&two, &[]);
    assert!(
        err.contains("authentication is on: bearer tokens of 2 tenants"),
        "{err}"
    );
    assert!(!err.contains("AUTHENTICATION IS OFF"), "{err}");
    assert!(
        err.contains("no [admin] token_sha256 is configured: the admin endpoints"),
        "{err}"
    );
    let err = start(&[], &[]);
    assert!(err.contains("AUTHENTICATION IS OFF"), "{err}");
    assert!(
        err.contains("the admin endpoints (/v1/admin/…) are open too"),
        "{err}"
    );
    let err = start(&two, &[token_sha256("adm")]);
    assert!(
        err.contains("the admin endpoints (/v1/admin/…) need one of 1 admin token"),
        "{err}"
    );
}

/// An operator finds a middleware's record by what the
/// client sent (`Idempotency-Key: neg`, quoted or with parameters), the
/// principal and the namespace; the summary shows the claim's worker label.
/// And `settle list --order`/`--key-prefix` reach the server's listing.
#[tokio::test]
async fn get_finds_a_middleware_record_by_its_idempotency_key() {
    let dir = TempDir::new("cli-mw");
    let s = Server::start(dir.path(), &[]);
    let lkey = settle_middleware::layout::ledger_key("payments", "acct-1", "neg");
    let f = fp(1);
    let claim = [
        "claim",
        &lkey,
        "--fingerprint",
        &f,
        "--principal",
        "acct-1",
        "--worker",
        "idempotency-key=neg principal=acct-1",
    ];
    let out = settle(&claim, &s.url());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for header in ["neg", "\"neg\"", "\"neg\";a=1"] {
        let out = settle(
            &[
                "get",
                "--idempotency-key",
                header,
                "--principal",
                "acct-1",
                "--namespace",
                "payments",
            ],
            &s.url(),
        );
        assert_eq!(out.status.code(), Some(0), "{header}: {}", stderr(&out));
        assert!(
            stdout(&out).contains(&format!("key:                {lkey}")),
            "{}",
            stdout(&out)
        );
        assert!(
            stdout(&out).contains("worker:             idempotency-key=neg principal=acct-1"),
            "{}",
            stdout(&out)
        );
        assert!(
            stderr(&out).contains(&lkey),
            "the ledger key is printed: {}",
            stderr(&out)
        );
    }
    // Another principal or namespace is another record.
    let out = settle(
        &[
            "get",
            "--idempotency-key",
            "neg",
            "--principal",
            "acct-2",
            "--namespace",
            "payments",
        ],
        &s.url(),
    );
    assert_eq!(out.status.code(), Some(4), "{}", stdout(&out));
    // --principal is required with --idempotency-key; KEY and it exclude each other.
    assert_eq!(
        settle(&["get", "--idempotency-key", "neg"], &s.url())
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        settle(
            &["get", &lkey, "--idempotency-key", "neg", "--principal", "p"],
            &s.url()
        )
        .status
        .code(),
        Some(2)
    );
    // The listing's order and prefix.
    let out = settle(
        &[
            "list",
            "--key-prefix",
            "mw-",
            "--order",
            "attention",
            "--json",
        ],
        &s.url(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["operations"][0]["key"], lkey.as_str());
    assert_eq!(
        settle(&["list", "--order", "time"], &s.url()).status.code(),
        Some(2)
    );
}

/// `settle reconcile --key-prefix P --finding
/// not_committed` reconciles every matching record that requires it, after
/// a confirmation (`--yes` without a terminal), and prints what it did;
/// records outside the prefix are left alone; any other finding is refused.
#[tokio::test]
async fn reconcile_many_by_key_prefix() {
    let dir = TempDir::new("cli-bulk");
    let s = Server::start(dir.path(), &[]);
    let ep = s.ep();
    let b = binding("svc", 0);
    for k in ["bulk-1", "bulk-2", "bulk-3", "other-1"] {
        let fence = execute(&ep, k, 1, &b).await;
        let unknown = serde_json::json!({"status": "unknown", "error": "the worker was killed"});
        let r = op(&ep, k, "settle", settle_body(fence, 1, &b, unknown)).await;
        assert_eq!(r.status, 200, "{}", r.json());
    }
    let required = |v: &Value| v["reconcile_required"].as_bool().unwrap();
    // No terminal, no --yes: refused, nothing changed.
    let out = settle(
        &[
            "reconcile",
            "--key-prefix",
            "bulk-",
            "--finding",
            "not_committed",
        ],
        &s.url(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("3 records"), "{}", stderr(&out));
    assert!(required(&get(&ep, "/v1/operations/bulk-1").await.json()));
    // Only not_committed in bulk.
    let out = settle(
        &[
            "reconcile",
            "--key-prefix",
            "bulk-",
            "--finding",
            "committed",
            "--yes",
        ],
        &s.url(),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = settle(
        &[
            "reconcile",
            "--key-prefix",
            "bulk-",
            "--finding",
            "not_committed",
            "--yes",
            "--json",
        ],
        &s.url(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            v["seen"].as_u64(),
            v["not_committed"].as_u64(),
            v["errors"].as_u64()
        ),
        (Some(3), Some(3), Some(0)),
        "{v}"
    );
    for k in ["bulk-1", "bulk-2", "bulk-3"] {
        let r = get(&ep, &format!("/v1/operations/{k}")).await.json();
        assert!(!required(&r), "{k}: {r}");
        // The next claim executes.
        let c = op(&ep, k, "claim", claim_body(1, &b)).await.json();
        assert_eq!(c["decision"], "execute", "{k}: {c}");
    }
    assert!(
        required(&get(&ep, "/v1/operations/other-1").await.json()),
        "outside the prefix: untouched"
    );
}

/// `settle completions SHELL` and `settle man` print what the Debian
/// package ships, generated from the parser: every subcommand is in them,
/// and a shell clap_complete does not know is a usage error (exit 2).
#[test]
fn completions_and_man_page_come_from_the_parser() {
    let run = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();
    let bash = run(&["completions", "bash"]);
    assert!(bash.status.success(), "{}", stderr(&bash));
    let bash = stdout(&bash);
    assert!(bash.contains("complete -F _settle"), "{bash}");
    let zsh = stdout(&run(&["completions", "zsh"]));
    assert!(zsh.starts_with("#compdef settle"), "{zsh}");
    let fish = stdout(&run(&["completions", "fish"]));
    assert!(fish.contains("complete -c settle"), "{fish}");
    let man = run(&["man"]);
    assert!(man.status.success(), "{}", stderr(&man));
    let man = stdout(&man);
    assert!(man.contains(".TH settle 1"), "{man}");
    for sub in [
        "serve",
        "claim",
        "settle",
        "backup",
        "export",
        "completions",
        "man",
    ] {
        assert!(
            bash.contains(sub) && zsh.contains(sub) && fish.contains(sub),
            "completions lack {sub}"
        );
        assert!(man.contains(sub), "the man page lacks {sub}");
    }
    let bad = run(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("possible values"), "{}", stderr(&bad));
}

/// `--pid-file`: the process id is there once the server listens (what
/// `kill -HUP $(cat FILE)` needs without systemd), and gone after it exits.
#[tokio::test]
async fn serve_writes_its_pid_file_and_removes_it_at_exit() {
    let tmp = TempDir::new("pidfile");
    let pid = tmp.path().join("settle.pid");
    let mut s = Server::start(
        &tmp.path().join("data"),
        &["--pid-file", pid.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read_to_string(&pid).unwrap(),
        format!("{}\n", s.child.id())
    );
    // Serving (and so handling SIGTERM) before it is stopped.
    assert_eq!(get(&s.ep(), "/healthz").await.status, 200);
    assert!(s.terminate().success());
    assert!(!pid.exists(), "removed at exit");
}
