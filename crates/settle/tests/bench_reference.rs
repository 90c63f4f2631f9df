//! `settle bench --data DIR --reference probe`: settle in process against
//! the probe (crates/settle/src/bench/probe.rs) in alternating rounds, one
//! line per run and a summary with the ratio of the medians.

mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

#[test]
fn the_reference_runs_settle_and_the_probe_and_reports_their_ratio() {
    let data = TempDir::new("bench-reference");
    let out = Command::new(BIN)
        .args(["bench", "--data"])
        .arg(data.path())
        .args(["--reference", "probe", "--concurrency", "8"])
        .args(["--duration", "0.3", "--rounds", "1", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let (settle, probe, summary) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(
        (settle["mode"].as_str(), settle["round"].as_u64()),
        (Some("in_process"), Some(1))
    );
    assert_eq!(
        (probe["mode"].as_str(), probe["round"].as_u64()),
        (Some("probe"), Some(1))
    );
    for run in [settle, probe] {
        assert_eq!(run["concurrency"], 8, "{run}");
        assert!(run["pairs"].as_u64().unwrap() > 0, "{run}");
        assert!(run["pairs_per_s"].as_f64().unwrap() > 0.0, "{run}");
        for f in ["p50_ms", "p99_ms", "p999_ms", "max_ms"] {
            assert!(run[f].as_f64().unwrap() > 0.0, "{f}: {run}");
        }
        if cfg!(target_os = "linux") {
            // (In clock ticks: a run this short may have taken none.)
            assert!(run["cpu_us_per_pair"].as_f64().unwrap() >= 0.0, "{run}");
        }
    }

    assert_eq!(summary["mode"], "reference", "{summary}");
    assert_eq!(summary["reference"], "probe");
    assert_eq!(
        (summary["concurrency"].as_u64(), summary["rounds"].as_u64()),
        (Some(8), Some(1))
    );
    // One round: the medians are the runs' figures.
    for (side, run) in [("settle", settle), ("probe", probe)] {
        for f in ["pairs_per_s", "p50_ms", "p99_ms"] {
            let (m, r) = (summary[side][f].as_f64().unwrap(), run[f].as_f64().unwrap());
            assert!(close(m, r), "{side}.{f}: {summary}");
        }
        if cfg!(target_os = "linux") {
            assert_eq!(
                summary[side]["cpu_us_per_pair"], run["cpu_us_per_pair"],
                "{summary}"
            );
        }
    }
    let ratio = settle["pairs_per_s"].as_f64().unwrap() / probe["pairs_per_s"].as_f64().unwrap();
    assert!(
        close(summary["ratio"].as_f64().unwrap(), ratio),
        "{ratio}: {summary}"
    );
    let tail = settle["p99_ms"].as_f64().unwrap() / settle["p50_ms"].as_f64().unwrap();
    assert!(
        close(summary["p99_over_p50"].as_f64().unwrap(), tail),
        "{summary}"
    );
    assert!(summary.get("cpu_ratio").is_some(), "{summary}");
    // The runs cleaned up after themselves: no store, no log left in DIR.
    let left: Vec<_> = std::fs::read_dir(data.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `--reference` without `--data` is a usage error (exit 2), with or
/// without another target.
#[test]
fn the_reference_needs_data() {
    for target in [&[][..], &["--url", "http://127.0.0.1:1"][..]] {
        let out = Command::new(BIN)
            .args(["bench", "--reference", "probe", "--duration", "0.1"])
            .args(target)
            .env_remove("SETTLE_TOKEN")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{target:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains("--data"),
            "{target:?}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
    let out = Command::new(BIN)
        .args([
            "bench",
            "--data",
            "/nonexistent",
            "--reference",
            "probe",
            "--records",
            "5",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
}

/// A flag of one target given with another is a usage error (exit 2) that
/// names the flag and the target it needs, and nothing runs: clap's
/// `requires` alone let `--data D --batch 3` run in process.
#[test]
fn a_flag_of_another_target_is_refused() {
    let data = TempDir::new("bench-targets");
    let d = data.path().to_str().unwrap();
    let cases: [(&[&str], &str, &str); 4] = [
        (&["--data", d, "--batch", "3"], "--batch", "--url"),
        (
            &["--data", d, "--ca-cert", "/nonexistent"],
            "--ca-cert",
            "--url",
        ),
        (
            &["--url", "http://127.0.0.1:1", "--records", "5"],
            "--records",
            "--data",
        ),
        (
            &["--url", "http://127.0.0.1:1", "--page-through"],
            "--page-through",
            "--data",
        ),
    ];
    for (args, flag, needs) in cases {
        let out = Command::new(BIN)
            .args(["bench", "--duration", "0.1", "--concurrency", "1"])
            .args(args)
            .env_remove("SETTLE_TOKEN")
            .env_remove("SETTLE_CA_CERT")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{flag} needs {needs}")),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    // Nothing was created in DIR.
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0);
}
