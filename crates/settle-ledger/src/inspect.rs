//! The inspection queries of SPEC §9 over any [`Store`]: a filtered,
//! keyset-paginated listing and per-tenant counts.
//!
//! An engine provides one primitive, [`Store::scan`]: the next records of
//! a tenant in key order after a key, each as `get` would show it. The
//! listing is a bounded scan over it (a page looks at no more than
//! [`SCAN_BUDGET`] records, so a filter that matches little answers short
//! pages with a cursor instead of reading the whole tenant), and the
//! counts are a full scan in chunks (memory stays bounded).

use settle_core::{Key, Record, Status, Timestamp};

use crate::store::{Store, StoreError};
use settle_core::TenantId;

/// Most records one listing page looks at (matching or not).
pub const SCAN_BUDGET: usize = 10_000;
/// Records fetched from the engine per scan call.
pub const SCAN_CHUNK: usize = 1_000;
/// The largest `limit` of a listing (SPEC §9).
pub const MAX_LIMIT: usize = 1_000;

/// A status as the listing filters it (`pending` includes `running`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ListStatus {
    /// Pending, with or without a lease.
    Pending,
    /// Pending with an open lease.
    Running,
    /// Unknown.
    Unknown,
    /// Conflict.
    Conflict,
    /// Failed.
    Failed,
    /// Completed.
    Completed,
}

impl ListStatus {
    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<ListStatus> {
        Some(match s {
            "pending" => ListStatus::Pending,
            "running" => ListStatus::Running,
            "unknown" => ListStatus::Unknown,
            "conflict" => ListStatus::Conflict,
            "failed" => ListStatus::Failed,
            "completed" => ListStatus::Completed,
            _ => return None,
        })
    }

    fn matches(self, r: &Record) -> bool {
        match self {
            ListStatus::Pending => r.status == Status::Pending,
            ListStatus::Running => r.status == Status::Pending && r.open_lease().is_some(),
            ListStatus::Unknown => r.status == Status::Unknown,
            ListStatus::Conflict => r.status == Status::Conflict,
            ListStatus::Failed => r.status == Status::Failed,
            ListStatus::Completed => r.status == Status::Completed,
        }
    }
}

/// The filters of a listing; `None` (or no statuses) matches every record.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Any of these statuses.
    pub statuses: Vec<ListStatus>,
    /// Whether the record requires reconciliation.
    pub reconcile_required: Option<bool>,
    /// Whether the record is disputed.
    pub disputed: Option<bool>,
    /// Whether the record is stuck (per `stuck_after_ms`).
    pub stuck: Option<bool>,
    /// Whether the record holds quarantined evidence.
    pub quarantined: Option<bool>,
    /// Keys starting with this.
    pub key_prefix: Option<String>,
}

impl ListFilter {
    /// Whether `r` (viewed at `now`) passes every filter.
    pub fn matches(&self, r: &Record, now: Timestamp, stuck_after_ms: u64) -> bool {
        (self.statuses.is_empty() || self.statuses.iter().any(|s| s.matches(r)))
            && self
                .reconcile_required
                .is_none_or(|v| r.reconcile_required == v)
            && self.disputed.is_none_or(|v| r.disputed == v)
            && self
                .stuck
                .is_none_or(|v| r.is_stuck(now, stuck_after_ms) == v)
            && self
                .quarantined
                .is_none_or(|v| (r.quarantine_total > 0) == v)
            && self
                .key_prefix
                .as_deref()
                .is_none_or(|p| r.key.as_str().starts_with(p))
    }
}

/// One listing request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// The filters.
    pub filter: ListFilter,
    /// Start strictly after this key (the previous page's cursor).
    pub after: Option<Key>,
    /// Most records returned (1..=[`MAX_LIMIT`]).
    pub limit: usize,
    /// A record untouched this long with no open lease is stuck.
    pub stuck_after_ms: u64,
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPage {
    /// Matching records in key order.
    pub records: Vec<Record>,
    /// Where the next page starts; `None` when the listing ended.
    pub next: Option<Key>,
    /// The store's clock when the page was read (for `stuck`).
    pub now: Timestamp,
}

/// What [`Store::scan`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// Records in key order, each viewed at `now` as `get` shows it (a
    /// record refused under SPEC §6.9 is listed as stored).
    pub records: Vec<Record>,
    /// The last key looked at, when more records may follow; `None` at the end.
    pub next: Option<Key>,
    /// The store's clock.
    pub now: Timestamp,
}

/// Counts over one tenant's records (SPEC §9 `GET /v1/stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TenantStats {
    /// Pending without an open lease.
    pub pending: u64,
    /// Pending with an open lease.
    pub running: u64,
    /// Unknown.
    pub unknown: u64,
    /// Conflict.
    pub conflict: u64,
    /// Failed.
    pub failed: u64,
    /// Completed.
    pub completed: u64,
    /// Every record.
    pub total: u64,
    /// Records that require reconciliation.
    pub reconcile_required: u64,
    /// Disputed records.
    pub disputed: u64,
    /// Stuck records.
    pub stuck: u64,
    /// Quarantined evidence entries.
    pub quarantined: u64,
    /// Records holding quarantined evidence.
    pub quarantined_records: u64,
    /// Records refused under SPEC §6.9 (a receipt from the future).
    pub refused: u64,
}

impl TenantStats {
    /// Adds one record viewed at `now`.
    pub fn count(&mut self, r: &Record, now: Timestamp, stuck_after_ms: u64) {
        self.total += 1;
        match r.status {
            Status::Pending if r.open_lease().is_some() => self.running += 1,
            Status::Pending => self.pending += 1,
            Status::Unknown => self.unknown += 1,
            Status::Conflict => self.conflict += 1,
            Status::Failed => self.failed += 1,
            Status::Completed => self.completed += 1,
        }
        self.reconcile_required += u64::from(r.reconcile_required);
        self.disputed += u64::from(r.disputed);
        self.stuck += u64::from(r.is_stuck(now, stuck_after_ms));
        self.quarantined += r.quarantine_total;
        self.quarantined_records += u64::from(r.quarantine_total > 0);
        self.refused += u64::from(r.is_from_the_future(now));
    }
}

/// One listing page: scans from the cursor in chunks until `limit` records
/// match, the tenant ends, or [`SCAN_BUDGET`] records were looked at.
pub async fn list<S: Store + ?Sized>(
    store: &S,
    tenant: &TenantId,
    q: &ListQuery,
) -> Result<ListPage, StoreError> {
    assert!(
        (1..=MAX_LIMIT).contains(&q.limit),
        "the caller validates limit"
    );
    let mut after = q.after.clone();
    let mut records = Vec::new();
    let mut seen = 0;
    let mut now = None;
    loop {
        let chunk = SCAN_CHUNK.min(SCAN_BUDGET - seen).max(1);
        let scan = store.scan(tenant, after.as_ref(), chunk).await?;
        let at = *now.get_or_insert(scan.now);
        seen += scan.records.len();
        for r in scan.records {
            if !q.filter.matches(&r, at, q.stuck_after_ms) {
                continue;
            }
            records.push(r);
            if records.len() == q.limit {
                // More may follow this record: the next page starts after it.
                let next = records.last().map(|r| r.key.clone());
                return Ok(ListPage {
                    records,
                    next,
                    now: at,
                });
            }
        }
        after = scan.next;
        if after.is_none() || seen >= SCAN_BUDGET {
            return Ok(ListPage {
                records,
                next: after,
                now: at,
            });
        }
    }
}

/// Counts every record of `tenant`, scanning in chunks.
pub async fn tenant_stats<S: Store + ?Sized>(
    store: &S,
    tenant: &TenantId,
    stuck_after_ms: u64,
) -> Result<TenantStats, StoreError> {
    let mut s = TenantStats::default();
    let mut after: Option<Key> = None;
    loop {
        let scan = store.scan(tenant, after.as_ref(), SCAN_CHUNK).await?;
        for r in &scan.records {
            s.count(r, scan.now, stuck_after_ms);
        }
        match scan.next {
            Some(k) => after = Some(k),
            None => return Ok(s),
        }
    }
}
