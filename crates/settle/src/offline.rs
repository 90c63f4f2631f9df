//! `settle inspect` and `settle check`, offline: read the data directory
//! of a stopped embedded store, count records by status, list the ones an
//! operator must look at, and check every record against SPEC §6
//! (read-only: a store that recovery would refuse is reported, never
//! repaired). The live inspection of SPEC §9 (`settle list`, `settle
//! stats`) is a server's, over the client (`remote/`).

use std::collections::BTreeMap;
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;
use settle_core::{Record, Status, TenantId, Timestamp};

use crate::exit::{self, Failure};

#[derive(Args)]
pub struct OfflineArgs {
    /// Directory of a stopped embedded store.
    #[arg(long, value_name = "DIR", default_value = settle_server::config::DEFAULT_DATA)]
    pub data: PathBuf,
    /// A non-terminal record without a live lease, untouched this many
    /// seconds, is stuck.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    pub stuck_after_s: u64,
    /// List at most this many keys per list (sorted); 0 lists every key.
    /// `--json` always lists every key.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub limit: usize,
    /// Print one JSON object (every list complete and sorted) instead of a
    /// summary.
    #[arg(long)]
    pub json: bool,
}

/// What the scan found; every list is sorted before it is shown.
#[derive(Default)]
struct Findings {
    counts: BTreeMap<&'static str, u64>,
    stuck: Vec<String>,
    unknown: Vec<String>,
    disputed: Vec<String>,
    quarantined: Vec<String>,
    refused: Vec<String>,
    reconcile: Vec<String>,
    violations: Vec<String>,
}

impl Findings {
    fn add(&mut self, tenant: &TenantId, r: &Record, now: Timestamp, stuck_ms: u64) {
        let id = format!("{tenant}/{}", r.key);
        if let Err(v) = settle_core::invariants::check_record(r) {
            self.violations.push(format!("{id}: {v}"));
        }
        if r.is_from_the_future(now) {
            self.refused.push(id.clone());
        }
        let status = if r.status == Status::Pending && r.open_lease().is_some() {
            "running"
        } else {
            r.status.as_str()
        };
        *self.counts.entry(status).or_default() += 1;
        if r.is_stuck(now, stuck_ms) {
            self.stuck.push(id.clone());
        }
        if r.status == Status::Unknown {
            self.unknown.push(id.clone());
        }
        if r.disputed {
            self.disputed.push(id.clone());
        }
        if r.quarantine_total > 0 {
            self.quarantined
                .push(format!("{id} ({})", r.quarantine_total));
        }
        if r.reconcile_required {
            self.reconcile.push(id);
        }
    }

    fn sort(&mut self) {
        for list in [
            &mut self.stuck,
            &mut self.unknown,
            &mut self.disputed,
            &mut self.quarantined,
            &mut self.refused,
            &mut self.reconcile,
            &mut self.violations,
        ] {
            list.sort_unstable();
        }
    }
}

/// `inspect` lists; `check` also fails on any violation or refused record.
pub fn run(a: OfflineArgs, check: bool) -> Result<(), Failure> {
    if !a.data.is_dir() {
        return Err(Failure::local(format!(
            "{} is not a directory",
            a.data.display()
        )));
    }
    if in_use(&a.data) {
        return Err(Failure::local(format!(
            "the store in {} is in use: stop the server first, or use the live API \
             (settle get KEY)",
            a.data.display()
        )));
    }
    let now = Timestamp::from_system_time(std::time::SystemTime::now());
    let stuck_ms = a.stuck_after_s.saturating_mul(1000);
    let mut found = Findings::default();
    let report = settle_embedded::scan(&a.data, |tenant, r| found.add(tenant, r, now, stuck_ms))
        .map_err(|e| Failure::local(format!("cannot read {}: {e}", a.data.display())))?;
    found.sort();
    let mut undecodable = report.undecodable;
    undecodable.sort_unstable();
    let failed =
        !(found.violations.is_empty() && found.refused.is_empty() && undecodable.is_empty());
    if a.json {
        print_json(&found, &undecodable, report.torn_tail.as_deref());
    } else {
        print_summary(&a, &found, &undecodable, report.torn_tail.as_deref());
    }
    if check && failed {
        Err(Failure::silent(exit::LOCAL))
    } else {
        Ok(())
    }
}

/// Whether another process (a running server) holds the store's lock.
/// Checked up front so the user hears what to do, not a lock error; the
/// scan takes the lock itself, so a server starting in between is still
/// refused there.
fn in_use(dir: &Path) -> bool {
    match File::open(dir.join("LOCK")) {
        Ok(f) => matches!(f.try_lock(), Err(TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

fn print_json(f: &Findings, undecodable: &[String], torn_tail: Option<&str>) {
    let total: u64 = f.counts.values().sum();
    let v = json!({
        "records": total,
        "by_status": f.counts,
        "stuck": f.stuck,
        "unknown": f.unknown,
        "disputed": f.disputed,
        "quarantined": f.quarantined,
        "refused": f.refused,
        "reconcile_required": f.reconcile,
        "violations": f.violations,
        "undecodable": undecodable,
        "torn_tail": torn_tail,
    });
    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
}

fn print_summary(a: &OfflineArgs, f: &Findings, undecodable: &[String], torn_tail: Option<&str>) {
    let total: u64 = f.counts.values().sum();
    println!("{total} records in {}", a.data.display());
    for (status, n) in &f.counts {
        println!("  {status:<10} {n}");
    }
    let limit = if a.limit == 0 { usize::MAX } else { a.limit };
    for (title, list) in [
        ("stuck", &f.stuck[..]),
        ("unknown", &f.unknown),
        ("reconcile_required", &f.reconcile),
        ("disputed", &f.disputed),
        ("quarantined", &f.quarantined),
        ("refused (receipt dated in the future)", &f.refused),
        ("violations of SPEC §6", &f.violations),
        ("undecodable (refused on every call)", undecodable),
    ] {
        println!("{title}: {}", list.len());
        for id in list.iter().take(limit) {
            println!("  {id}");
        }
        if list.len() > limit {
            println!(
                "  … and {} more (--limit N shows more, --json lists all)",
                list.len() - limit
            );
        }
    }
    if let Some(t) = torn_tail {
        println!("torn log tail (never acknowledged; cut when the store next opens): {t}");
    }
}
