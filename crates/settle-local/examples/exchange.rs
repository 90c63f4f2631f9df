//! The cost of one claim + settle pair through [`LocalLedger::exchange`],
//! in memory or on a directory (what the SDKs' local mode pays below the
//! language): `cargo run --release -p settle-local --example exchange
//! [PAIRS [DIR]]`.

#![allow(clippy::print_stdout)] // an example prints its figures

use std::time::Instant;

use settle_local::LocalLedger;

fn main() {
    let pairs: usize = std::env::args()
        .nth(1)
        .map_or(20_000, |a| a.parse().expect("PAIRS is a number"));
    let dir = std::env::args().nth(2).map(std::path::PathBuf::from);
    let l = LocalLedger::open(dir.as_deref()).expect("the ledger opens");
    let h = [("content-type".to_owned(), "application/json".to_owned())];
    let fp = "1".repeat(64);
    let binding = r#"{"principal":"b","scopes":[],"generation":0}"#;
    let mut lat = Vec::with_capacity(pairs);
    let t0 = Instant::now();
    for i in 0..pairs {
        let t = Instant::now();
        let claim = format!(r#"{{"fingerprint":"{fp}","binding":{binding}}}"#);
        let a = l
            .exchange(
                "POST",
                &format!("/v1/operations/k{i}/claim"),
                &h,
                claim.into_bytes(),
            )
            .expect("claim answered");
        assert_eq!(a.status, 200);
        let fence = serde_json::from_slice::<serde_json::Value>(&a.body).expect("JSON")["fence"]
            .as_u64()
            .expect("a grant's fence");
        let settle = format!(
            r#"{{"fence":{fence},"fingerprint":"{fp}","binding":{binding},"outcome":{{"status":"completed","result":{{"ok":true}},"response_sha256":"{}"}}}}"#,
            "2".repeat(64)
        );
        let a = l
            .exchange(
                "POST",
                &format!("/v1/operations/k{i}/settle"),
                &h,
                settle.into_bytes(),
            )
            .expect("settle answered");
        assert_eq!(a.status, 200, "{}", String::from_utf8_lossy(&a.body));
        lat.push(t.elapsed());
    }
    let wall = t0.elapsed();
    lat.sort();
    println!(
        "{{\"pairs\":{pairs},\"pairs_per_s\":{:.0},\"p50_us\":{:.1}}}",
        pairs as f64 / wall.as_secs_f64(),
        lat[pairs / 2].as_secs_f64() * 1e6
    );
}
