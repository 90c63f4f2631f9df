//! The inspection queries of SPEC §9 over any [`Store`]: a filtered,
//! keyset-paginated listing and per-tenant counts.
//!
//! An engine provides one primitive, [`Store::scan`]: the next records of
//! a tenant in key order after a key, each as `get` would show it. The
//! listing in key order is a bounded scan over it (a page looks at no
//! more than [`SCAN_BUDGET`] records, so a filter that matches little
//! answers short pages with a cursor instead of reading the whole tenant;
//! a `key_prefix` starts the scan at the prefix and ends it past the
//! prefix). The listings in time order (`updated`, `attention`) have no
//! index to walk: each page reads every record of the tenant that the
//! prefix allows, in chunks, and keeps the first `limit` after the
//! cursor (memory stays bounded by `limit`; the time grows with the
//! tenant). The counts are a full scan in chunks.

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

/// The order of a listing (SPEC §9 `order`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ListOrder {
    /// By key (the default): a bounded scan.
    #[default]
    Key,
    /// Most recently updated first (then by key).
    Updated,
    /// Reconcile required, then disputed, then stuck, then the rest; most
    /// recently updated first within each (then by key).
    Attention,
}

impl ListOrder {
    /// Parses the wire spelling.
    pub fn parse(s: &str) -> Option<ListOrder> {
        Some(match s {
            "key" => ListOrder::Key,
            "updated" => ListOrder::Updated,
            "attention" => ListOrder::Attention,
            _ => return None,
        })
    }
}

/// Where a listing page ends: the position of its last record in the
/// listing's order. Its text form ([`Cursor::to_text`]) is what the wire's
/// opaque cursor encodes; it names its order, so a cursor of one order is
/// refused by another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cursor {
    /// Key order: strictly after this key.
    Key(Key),
    /// Time order: after this record's place (see [`ListOrder`]).
    Ordered {
        /// The order the position belongs to.
        order: ListOrder,
        /// The attention bucket (0 reconcile required, 1 disputed, 2
        /// stuck, 3 the rest; 0 for `updated`).
        bucket: u8,
        /// The record's `updated_at`.
        updated_at: Timestamp,
        /// The record's key.
        key: Key,
    },
}

impl Cursor {
    /// The order this cursor continues.
    pub fn order(&self) -> ListOrder {
        match self {
            Cursor::Key(_) => ListOrder::Key,
            Cursor::Ordered { order, .. } => *order,
        }
    }

    /// The text form: the key alone for key order (keys have no spaces),
    /// else `u <updated_ms> <key>` or `a <bucket> <updated_ms> <key>`.
    pub fn to_text(&self) -> String {
        match self {
            Cursor::Key(k) => k.as_str().to_string(),
            Cursor::Ordered {
                order: ListOrder::Attention,
                bucket,
                updated_at,
                key,
            } => format!("a {bucket} {} {}", updated_at.0, key.as_str()),
            Cursor::Ordered {
                updated_at, key, ..
            } => format!("u {} {}", updated_at.0, key.as_str()),
        }
    }

    /// Reads a text form back; `None` for anything [`to_text`](Self::to_text) does not write.
    pub fn from_text(text: &str) -> Option<Cursor> {
        let parts: Vec<&str> = text.split(' ').collect();
        // Digits only, at most 18 (the OpenAPI pattern of `after`): every
        // such number fits the stores' signed 64-bit columns, and `+1`,
        // which `parse` takes, is not a cursor this code writes.
        let ms = |s: &str| {
            (!s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok().map(Timestamp))
                .flatten()
        };
        Some(match parts.as_slice() {
            [key] => Cursor::Key(Key::new(*key).ok()?),
            ["u", at, key] => Cursor::Ordered {
                order: ListOrder::Updated,
                bucket: 0,
                updated_at: ms(at)?,
                key: Key::new(*key).ok()?,
            },
            ["a", bucket, at, key] => Cursor::Ordered {
                order: ListOrder::Attention,
                bucket: bucket.parse().ok().filter(|b| *b <= 3)?,
                updated_at: ms(at)?,
                key: Key::new(*key).ok()?,
            },
            _ => return None,
        })
    }
}

/// The attention bucket of a record viewed at `now` (SPEC §9 `order=attention`).
fn attention_bucket(r: &Record, now: Timestamp, stuck_after_ms: u64) -> u8 {
    if r.reconcile_required {
        0
    } else if r.disputed {
        1
    } else if r.is_stuck(now, stuck_after_ms) {
        2
    } else {
        3
    }
}

/// The longest key (SPEC §2: 1–255 bytes).
const LONGEST_KEY: usize = 255;

/// The greatest valid key below every key that starts with `prefix`, so
/// that a scan strictly after it starts at the prefix: the prefix with its
/// last byte lowered by one and then filled up with `~` (the largest key
/// byte) to the longest key; `None` when nothing is below the prefix.
pub fn before_prefix(prefix: &str) -> Option<Key> {
    let b = prefix.as_bytes();
    let (last, head) = b.split_last()?;
    let mut k = head.to_vec();
    if *last > 0x21 {
        k.push(last - 1);
        k.resize(LONGEST_KEY.max(k.len()), b'~');
    }
    if k.is_empty() {
        return None;
    }
    Key::new(String::from_utf8(k).ok()?).ok()
}

/// One listing request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// The filters.
    pub filter: ListFilter,
    /// The order of the records.
    pub order: ListOrder,
    /// Continue after this position (the previous page's cursor; its order
    /// must be `order`).
    pub after: Option<Cursor>,
    /// Most records returned (1..=[`MAX_LIMIT`]).
    pub limit: usize,
    /// A record untouched this long with no open lease is stuck.
    pub stuck_after_ms: u64,
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPage {
    /// Matching records in the listing's order.
    pub records: Vec<Record>,
    /// Where the next page starts; `None` when the listing ended.
    pub next: Option<Cursor>,
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

/// One listing page. In key order: scans from the cursor (or the prefix)
/// in chunks until `limit` records match, the tenant or the prefix ends,
/// or [`SCAN_BUDGET`] records were looked at. In time order: see
/// [`list_ordered`].
pub async fn list<S: Store + ?Sized>(
    store: &S,
    tenant: &TenantId,
    q: &ListQuery,
) -> Result<ListPage, StoreError> {
    assert!(
        (1..=MAX_LIMIT).contains(&q.limit),
        "the caller validates limit"
    );
    assert!(
        q.after.as_ref().is_none_or(|c| c.order() == q.order),
        "the caller refuses a cursor of another order"
    );
    if q.order != ListOrder::Key {
        return list_ordered(store, tenant, q).await;
    }
    let prefix = q.filter.key_prefix.as_deref();
    let mut after = match &q.after {
        Some(Cursor::Key(k)) => Some(k.clone()),
        Some(Cursor::Ordered { .. }) => unreachable!("asserted above"),
        None => prefix.and_then(before_prefix),
    };
    let mut records = Vec::new();
    let mut seen = 0;
    let mut now = None;
    loop {
        let chunk = SCAN_CHUNK.min(SCAN_BUDGET - seen).max(1);
        let scan = store.scan(tenant, after.as_ref(), chunk).await?;
        let at = *now.get_or_insert(scan.now);
        seen += scan.records.len();
        for r in scan.records {
            if let Some(p) = prefix
                && !r.key.as_str().starts_with(p)
                && r.key.as_str() > p
            {
                // Keys come in order: past the prefix, nothing more can match.
                return Ok(ListPage {
                    records,
                    next: None,
                    now: at,
                });
            }
            if !q.filter.matches(&r, at, q.stuck_after_ms) {
                continue;
            }
            records.push(r);
            if records.len() == q.limit {
                // More may follow this record: the next page starts after it.
                let next = records.last().map(|r| Cursor::Key(r.key.clone()));
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
                next: after.map(Cursor::Key),
                now: at,
            });
        }
    }
}

/// A record's place in a time order: smaller comes first.
type Place = (u8, std::cmp::Reverse<Timestamp>, Key);

/// One page in time order: every record the prefix allows is read (in
/// chunks; there is no index by time), the matching ones after the cursor
/// are kept in a bounded max-heap of `limit`, and the page is the first
/// `limit` of them; `next` is set when more matched.
async fn list_ordered<S: Store + ?Sized>(
    store: &S,
    tenant: &TenantId,
    q: &ListQuery,
) -> Result<ListPage, StoreError> {
    let prefix = q.filter.key_prefix.as_deref();
    let from: Option<Place> = match &q.after {
        Some(Cursor::Ordered {
            bucket,
            updated_at,
            key,
            ..
        }) => Some((*bucket, std::cmp::Reverse(*updated_at), key.clone())),
        _ => None,
    };
    let mut heap: std::collections::BinaryHeap<(Place, usize)> =
        std::collections::BinaryHeap::new();
    let mut kept: std::collections::HashMap<usize, Record> = std::collections::HashMap::new();
    let mut more = false;
    let mut after = prefix.and_then(before_prefix);
    let mut now = None;
    let mut n = 0usize;
    'scan: loop {
        let scan = store.scan(tenant, after.as_ref(), SCAN_CHUNK).await?;
        let at = *now.get_or_insert(scan.now);
        for r in scan.records {
            if let Some(p) = prefix
                && !r.key.as_str().starts_with(p)
                && r.key.as_str() > p
            {
                break 'scan;
            }
            if !q.filter.matches(&r, at, q.stuck_after_ms) {
                continue;
            }
            let bucket = match q.order {
                ListOrder::Attention => attention_bucket(&r, at, q.stuck_after_ms),
                _ => 0,
            };
            let place: Place = (bucket, std::cmp::Reverse(r.updated_at), r.key.clone());
            if from.as_ref().is_some_and(|f| &place <= f) {
                continue;
            }
            n += 1;
            heap.push((place, n));
            kept.insert(n, r);
            if heap.len() > q.limit {
                let (_, dropped) = heap.pop().expect("over the limit");
                kept.remove(&dropped);
                more = true;
            }
        }
        match scan.next {
            Some(k) => after = Some(k),
            None => break,
        }
    }
    let now = match now {
        Some(t) => t,
        None => store.now().await?,
    };
    let mut page: Vec<(Place, usize)> = heap.into_sorted_vec();
    let next = match page.last() {
        Some(((bucket, std::cmp::Reverse(updated_at), key), _)) if more => Some(Cursor::Ordered {
            order: q.order,
            bucket: *bucket,
            updated_at: *updated_at,
            key: key.clone(),
        }),
        _ => None,
    };
    let records = page
        .drain(..)
        .map(|(_, i)| kept.remove(&i).expect("kept beside its place"))
        .collect();
    Ok(ListPage { records, next, now })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_prefix_is_below_every_key_with_the_prefix_and_above_the_rest() {
        let keys = [
            "!", "!!", "a", "mv~", "mw", "mw,", "mw,~~", "mw-", "mw-0", "mw-~", "mw.", "mx", "~",
        ];
        for prefix in ["!", "!!", "a", "mw-", "mw", "~", "a!"] {
            let b = before_prefix(prefix);
            for k in keys {
                let after = b.as_ref().is_none_or(|b| k > b.as_str());
                assert_eq!(
                    after,
                    k >= prefix,
                    "prefix {prefix:?}, key {k:?}, from {b:?}"
                );
            }
        }
        assert_eq!(before_prefix("!"), None);
        assert_eq!(before_prefix("a!").unwrap().as_str(), "a");
        assert_eq!(before_prefix("mw-").unwrap().as_str().len(), 255);
    }

    #[test]
    fn cursors_read_back_and_name_their_order() {
        let k = Key::new("mw-1").unwrap();
        for c in [
            Cursor::Key(k.clone()),
            Cursor::Ordered {
                order: ListOrder::Updated,
                bucket: 0,
                updated_at: Timestamp(5),
                key: k.clone(),
            },
            Cursor::Ordered {
                order: ListOrder::Attention,
                bucket: 2,
                updated_at: Timestamp(7),
                key: k.clone(),
            },
        ] {
            assert_eq!(Cursor::from_text(&c.to_text()), Some(c.clone()));
        }
        for bad in ["", "a b", "u x k", "a 4 1 k", "u 1 k extra", "a 1 1"] {
            assert_eq!(Cursor::from_text(bad), None, "{bad:?}");
        }
    }
}
