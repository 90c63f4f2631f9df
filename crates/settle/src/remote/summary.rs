//! The human-readable rendering of each answer shape (without `--json`).

use serde_json::Value;
use serde_json::value::RawValue;

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn receipt_line(r: &Value) -> String {
    format!(
        "receipt  status={} fence={} committed_at={} response_sha256={} durable={}",
        s(&r["status"]),
        s(&r["fence"]),
        s(&r["committed_at"]),
        s(&r["response_sha256"]),
        s(&r["durable"])
    )
}

/// The exact text of `outcome.result` in an answer (a replay or a record).
pub fn raw_result(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Outer {
        outcome: Option<Inner>,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        // Not an Option: a JSON null result is the text `null`.
        result: Box<RawValue>,
    }
    let o: Outer = serde_json::from_slice(body).ok()?;
    Some(o.outcome?.result.get().to_string())
}

/// A short rendering of each answer shape; `result` is the exact text of
/// the answer's `outcome.result`, if it has one.
pub fn print(v: &Value, result: Option<&str>) {
    let result = result.unwrap_or("-");
    if let Some(d) = v["decision"].as_str() {
        decision(d, v, result);
    } else if v.get("receipt").is_some() && v.get("reservation").is_none() {
        println!("{}", receipt_line(&v["receipt"]));
    } else if v.get("released").is_some() {
        println!("released  fence={}", s(&v["fence"]));
    } else if v.get("reservation").is_some() {
        record(v, result);
    } else if let Some(ws) = v["warnings"].as_array() {
        if ws.is_empty() {
            println!("no warnings");
        }
        for w in ws {
            warning(w);
        }
    } else if v.get("class").is_some() {
        warning(v);
    } else if v.get("generation").is_some() {
        println!("{}  generation={}", s(&v["principal"]), s(&v["generation"]));
    } else if v.get("lease_expires_at").is_some() {
        println!(
            "fence={} lease_expires_at={}{}",
            s(&v["fence"]),
            s(&v["lease_expires_at"]),
            if v["dispatched"] == Value::Bool(true) {
                " dispatched"
            } else {
                ""
            }
        );
    } else {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }
}

fn decision(d: &str, v: &Value, result: &str) {
    match d {
        "execute" | "reconcile" => println!(
            "{d}  fence={} attempt={} lease_expires_at={}",
            s(&v["fence"]),
            s(&v["attempt"]),
            s(&v["lease_expires_at"])
        ),
        "in_flight" => println!("in_flight  retry_after_ms={}", s(&v["retry_after_ms"])),
        "replay" => {
            println!("replay  status={}", s(&v["outcome"]["status"]));
            println!("{}", receipt_line(&v["receipt"]));
            println!("result: {result}");
        }
        _ => println!("{v}"),
    }
}

fn warning(w: &Value) {
    println!(
        "{}/{}  count={}{} last_at={} detail={}",
        s(&w["task"]),
        s(&w["class"]),
        s(&w["count"]),
        if w["saturated"] == Value::Bool(true) {
            " (saturated)"
        } else {
            ""
        },
        s(&w["last_at"]),
        s(&w["detail"])
    );
}

fn record(v: &Value, result: &str) {
    println!("key:                {}", s(&v["key"]));
    println!("status:             {}", s(&v["status"]));
    let r = &v["reservation"];
    println!(
        "reservation:        fingerprint={} principal={} scopes={} generation={}",
        s(&r["fingerprint"]),
        s(&r["principal"]),
        r["scopes"],
        s(&r["generation"])
    );
    let l = &v["lease"];
    if l.is_object() {
        let state = if l["ended"].is_null() {
            "live".to_string()
        } else {
            format!("ended ({})", s(&l["ended"]["reason"]))
        };
        println!(
            "lease:              fence={} purpose={} expires_at={} dispatched={} {state}",
            s(&l["fence"]),
            s(&l["purpose"]),
            s(&l["expires_at"]),
            s(&l["dispatched"])
        );
    }
    println!("reconcile_required: {}", s(&v["reconcile_required"]));
    println!("disputed:           {}", s(&v["disputed"]));
    println!("attempts:           {}", s(&v["attempts_total"]));
    println!("quarantined:        {}", s(&v["quarantine_total"]));
    if v["receipt"].is_object() {
        println!("{}", receipt_line(&v["receipt"]));
    }
    if v["outcome"].is_object() {
        println!("result: {result}");
    }
    for a in v["attempts"].as_array().into_iter().flatten() {
        if !a["error"].is_null() || !a["receipt"].is_null() {
            println!(
                "attempt {}:          receipt={} error={:?}",
                s(&a["number"]),
                s(&a["receipt"]["status"]),
                a["error"].as_str().unwrap_or("-")
            );
        }
    }
    println!("expires_at:         {}", s(&v["expires_at"]));
}
