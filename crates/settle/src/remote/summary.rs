//! The human-readable rendering of each answer (without `--json`).

use std::fmt::Display;

use settle_client::api::{
    ClaimDecision, Dispatched, LeaseInfo, ListResponse, Outcome, Receipt, ReceiptResponse,
    ReconcileResponse, RecordView, Released, Revoked, Stats, Warning, Warnings,
};

/// An answer that can print itself as a short summary.
pub trait Summary {
    fn print(&self);
}

/// A present value as text, an absent one as `-`.
fn or_dash<T: Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "-".to_string(), ToString::to_string)
}

/// A wire enum as the wire spells it.
fn wire<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "-".into(),
    }
}

fn receipt_line(r: &Receipt) -> String {
    format!(
        "receipt  status={} fence={} committed_at={} response_sha256={} durable={}",
        wire(&r.status),
        r.fence,
        r.committed_at,
        or_dash(&r.response_sha256),
        r.durable
    )
}

/// The exact text of an outcome's result (`-` without one).
fn result_text(o: Option<&Outcome>) -> &str {
    o.and_then(|o| o.result.as_deref()).map_or("-", |r| r.get())
}

impl Summary for ClaimDecision {
    fn print(&self) {
        match self {
            ClaimDecision::Execute(g) | ClaimDecision::Reconcile(g) => println!(
                "{}  fence={} attempt={} lease_expires_at={}",
                if matches!(self, ClaimDecision::Execute(_)) {
                    "execute"
                } else {
                    "reconcile"
                },
                g.fence,
                g.attempt,
                g.lease_expires_at
            ),
            ClaimDecision::InFlight {
                retry_after_ms,
                lease_expires_at,
            } => {
                println!(
                    "in_flight  retry_after_ms={retry_after_ms} lease_expires_at={lease_expires_at}"
                )
            }
            ClaimDecision::Replay { outcome, receipt } => {
                println!("replay  status={}", wire(&outcome.status));
                println!("{}", receipt_line(receipt));
                println!("result: {}", result_text(Some(outcome)));
            }
        }
    }
}

impl Summary for LeaseInfo {
    fn print(&self) {
        println!(
            "fence={} lease_expires_at={}",
            self.fence, self.lease_expires_at
        );
    }
}

impl Summary for Dispatched {
    fn print(&self) {
        println!(
            "fence={} lease_expires_at={}{}",
            self.fence,
            self.lease_expires_at,
            if self.dispatched { " dispatched" } else { "" }
        );
    }
}

impl Summary for ReceiptResponse {
    fn print(&self) {
        println!("{}", receipt_line(&self.receipt));
    }
}

impl Summary for Released {
    fn print(&self) {
        println!("released  fence={}", self.fence);
    }
}

impl Summary for ReconcileResponse {
    fn print(&self) {
        match self {
            ReconcileResponse::Execute(d) => d.print(),
            ReconcileResponse::Receipt(r) => r.print(),
            ReconcileResponse::Released(r) => r.print(),
        }
    }
}

impl Summary for Revoked {
    fn print(&self) {
        println!("{}  generation={}", self.principal, self.generation);
    }
}

impl Summary for Warning {
    fn print(&self) {
        println!(
            "{}/{}  count={} saturated={} detail={}",
            self.task,
            self.class,
            self.count,
            self.saturated,
            or_dash(&self.detail)
        );
    }
}

impl Summary for Warnings {
    fn print(&self) {
        if self.warnings.is_empty() {
            println!("no warnings");
        }
        for w in &self.warnings {
            println!(
                "{}/{}  count={}{} last_at={} detail={}",
                w.task,
                w.class,
                w.count,
                if w.saturated { " (saturated)" } else { "" },
                w.last_at,
                or_dash(&w.detail)
            );
        }
    }
}

impl Summary for RecordView {
    fn print(&self) {
        println!("key:                {}", self.key);
        println!("status:             {}", self.status.as_str());
        let r = &self.reservation;
        println!(
            "reservation:        fingerprint={} principal={} scopes={} generation={}",
            r.fingerprint,
            r.principal,
            serde_json::to_string(&r.scopes).unwrap_or_default(),
            r.generation
        );
        if let Some(l) = &self.lease {
            let state = match &l.ended {
                None => "live".to_string(),
                Some(e) => format!("ended ({})", wire(&e.reason)),
            };
            println!(
                "lease:              fence={} purpose={} expires_at={} dispatched={} {state}",
                l.fence,
                wire(&l.purpose),
                l.expires_at,
                l.dispatched
            );
        }
        // The worker label of the latest claim that gave one (a middleware
        // writes the client's Idempotency-Key and principal there).
        if let Some(w) = self
            .attempts
            .iter()
            .rev()
            .find_map(|a| a.lease.worker.as_deref())
        {
            println!("worker:             {w}");
        }
        println!("reconcile_required: {}", self.reconcile_required);
        println!("disputed:           {}", self.disputed);
        println!("attempts:           {}", self.attempts_total);
        println!("quarantined:        {}", self.quarantine_total);
        if let Some(rc) = &self.receipt {
            println!("{}", receipt_line(rc));
        }
        if self.outcome.is_some() {
            println!("result: {}", result_text(self.outcome.as_ref()));
        }
        for a in &self.attempts {
            if a.error.is_some() || a.receipt.is_some() {
                println!(
                    "attempt {}:          receipt={} error={:?}",
                    a.number,
                    a.receipt.as_ref().map_or("-".into(), |r| wire(&r.status)),
                    a.error.as_deref().unwrap_or("-")
                );
            }
        }
        println!("expires_at:         {}", or_dash(&self.expires_at));
    }
}

impl Summary for ListResponse {
    fn print(&self) {
        if self.operations.is_empty() {
            println!("no operations on this page");
        }
        for o in &self.operations {
            let mut flags = Vec::new();
            if o.reconcile_required {
                flags.push("reconcile_required".to_string());
            }
            if o.disputed {
                flags.push("disputed".into());
            }
            if o.stuck {
                flags.push("stuck".into());
            }
            if o.quarantined > 0 {
                flags.push(format!("quarantined={}", o.quarantined));
            }
            let lease = o.lease.as_ref().map_or_else(
                || "-".to_string(),
                |l| format!("{}@{}", wire(&l.purpose), l.fence),
            );
            println!(
                "{}  status={} lease={} attempts={} updated_at={}{}{}",
                o.key,
                wire(&o.status),
                lease,
                o.attempts,
                o.updated_at,
                if flags.is_empty() { "" } else { " " },
                flags.join(" ")
            );
        }
        match &self.next {
            Some(c) => println!("next: --cursor {c}"),
            None => println!("end of listing"),
        }
    }
}

impl Summary for Stats {
    fn print(&self) {
        let b = &self.by_status;
        println!(
            "total={} pending={} running={} unknown={} conflict={} failed={} completed={}",
            self.total, b.pending, b.running, b.unknown, b.conflict, b.failed, b.completed
        );
        println!(
            "reconcile_required={} disputed={} stuck={} quarantined={} quarantined_records={} refused={}",
            self.reconcile_required,
            self.disputed,
            self.stuck,
            self.quarantined,
            self.quarantined_records,
            self.refused
        );
    }
}
