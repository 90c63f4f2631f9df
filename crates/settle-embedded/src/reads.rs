//! The reads both stores serve the same way, on the calling thread: the
//! `get` view, warnings, the sweep's candidates, stats, the listing and
//! health. They read the published state ([`Shared`]) and never wait for
//! the writer.

use settle_core::{
    Command, Key, Principals, Record, RefusalCode, TaskId, TenantId, Timestamp, Warning, view_at,
};
use settle_ledger::inspect::Scan;
use settle_ledger::{StoreError, StoreStats};

use crate::Shared;
use crate::codec::{EntityKey, Value};
use crate::index::{Index, expiry_key};

pub(crate) fn get_sync<I: Index>(
    shared: &Shared<I>,
    tenant: &TenantId,
    key: &Key,
) -> Result<Result<Option<Record>, RefusalCode>, StoreError> {
    let now = shared.now();
    let k = EntityKey::Record(tenant.clone(), key.clone()).to_bytes();
    let rec = match shared.load(&k)?.as_deref() {
        Some(Value::Record(r)) => Some(r.clone()),
        Some(Value::Undecodable(_)) => return Ok(Err(RefusalCode::RecordRefused)),
        _ => None,
    };
    let mut principals = Principals::new();
    if let Some(r) = &rec {
        let p = &r.reservation.principal;
        match shared.principal(tenant, p)? {
            Ok(st) => principals.insert(p.clone(), st),
            Err(code) => return Ok(Err(code)),
        }
    }
    Ok(view_at(rec.as_ref(), &principals, now))
}

pub(crate) fn warnings_sync<I: Index>(
    shared: &Shared<I>,
    tenant: &TenantId,
    task: &TaskId,
) -> Result<Vec<Warning>, StoreError> {
    let k = EntityKey::Task(tenant.clone(), task.clone()).to_bytes();
    match shared.load(&k)?.as_deref() {
        Some(Value::Warnings(w)) => Ok(w.clone()),
        Some(Value::Undecodable(e)) => Err(StoreError::Corrupt(format!(
            "the warnings of task {task} do not decode: {e}"
        ))),
        _ => Ok(Vec::new()),
    }
}

/// Expiry entries read per page; the sweep acts on at most `SWEEP_DUE` of them.
const DUE_PAGE: usize = 1000;
const SWEEP_DUE: usize = 10_000;

/// Candidates for the sweep: open records whose lease lapsed, terminal
/// records past retention (in memory and in the expiry index). A stored
/// value that does not decode is skipped (and counted), never a reason to stop.
pub(crate) fn sweep_candidates<I: Index>(
    shared: &Shared<I>,
    now: Timestamp,
) -> Result<Vec<(TenantId, Command)>, StoreError> {
    let mut out = Vec::new();
    // Terminal records in memory past their retention: only once the bound
    // on their expiries has passed is the whole map walked (it holds each
    // shard while it is read). The walk sets the bound again; a batch
    // published meanwhile lowers it after its states are in the map.
    let bound = shared.take_due_bound();
    let mut next = bound;
    if bound <= now.millis() {
        next = u64::MAX;
        shared.for_each_resident(|key, value| {
            let Value::Record(r) = value else {
                return;
            };
            let Some(expires) = r.expires_at() else {
                return;
            };
            if r.is_collectable(now) && !r.is_from_the_future(now) {
                out.push(Box::<[u8]>::from(key));
            } else {
                // Not collected yet (from the future, or not due): looked at again.
                next = next.min(expires.millis());
            }
        });
    }
    shared.lower_due_bound(next);
    // Open leases: the records `leased` names, copied first (the writer
    // holds that lock while it applies a batch), then each looked at in the map.
    let keys: Vec<Box<[u8]>> = shared.leased_keys();
    let mut leased = Vec::new();
    for k in keys {
        let Some(value) = shared.resident_state(&k) else {
            continue;
        };
        let Value::Record(r) = &*value else {
            continue;
        };
        if r.is_from_the_future(now) {
            continue;
        }
        if let Some(l) = r.open_lease() {
            leased.push((
                k.clone(),
                r.reservation.principal.clone(),
                l.expires_at,
                l.generation,
            ));
        }
    }
    let mut out: Vec<(TenantId, Command)> = out
        .into_iter()
        .filter_map(|k| match EntityKey::from_bytes(&k) {
            Ok(EntityKey::Record(t, key)) => Some((t, Command::Collect { key })),
            _ => None,
        })
        .collect();
    for (k, principal, expires_at, lease_generation) in leased {
        let Ok(EntityKey::Record(t, key)) = EntityKey::from_bytes(&k) else {
            continue;
        };
        let Ok(p) = shared.principal(&t, &principal)? else {
            continue;
        };
        if now >= expires_at || lease_generation < p.generation {
            out.push((t, Command::Expire { key }));
        }
    }
    let mut after: Option<Vec<u8>> = None;
    let mut due = 0;
    while due < SWEEP_DUE {
        let page = shared
            .index()
            .due(after.as_deref(), now.millis(), DUE_PAGE)?;
        for (t, k) in &page {
            match shared.load(k)?.as_deref() {
                Some(Value::Record(r)) if r.expires_at().map(|e| e.millis()) == Some(*t) => {
                    if let Ok(EntityKey::Record(tenant, key)) = EntityKey::from_bytes(k) {
                        out.push((tenant, Command::Collect { key }));
                        due += 1;
                    }
                }
                // Refused on every access and counted; its entry stays.
                Some(Value::Undecodable(_)) => {}
                // The record was collected or reserved afresh: the entry is stale.
                _ => shared.index().forget_expiry(*t, k)?,
            }
        }
        match page.last() {
            Some((t, k)) if page.len() == DUE_PAGE => after = Some(expiry_key(*t, k)),
            _ => break,
        }
    }
    Ok(out)
}

pub(crate) fn stats_sync<I: Index>(shared: &Shared<I>, stuck_after_ms: u64) -> StoreStats {
    let now = shared.now();
    let mut s = StoreStats::default();
    shared.for_each_resident(|_, value| {
        if let Value::Record(r) = value {
            if r.is_from_the_future(now) {
                s.refused += 1;
            }
            s.count(r, now, stuck_after_ms);
        }
    });
    s.disputed = shared.disputed();
    s.undecodable = shared.undecodable();
    s
}

/// The next `max` records of `tenant` after `after`: the sorted keys of
/// the records in memory merged with the index's, each loaded and viewed
/// like `get`. Holds the key set's read lock only to copy `max` keys, so
/// the writer waits at most that long.
pub(crate) fn scan_sync<I: Index>(
    shared: &Shared<I>,
    tenant: &TenantId,
    after: Option<&Key>,
    max: usize,
) -> Result<Scan, StoreError> {
    use std::ops::Bound;
    let max = max.max(1);
    let now = shared.now();
    let prefix = EntityKey::Record(tenant.clone(), Key::new("!").expect("valid key")).to_bytes();
    let prefix = &prefix[..prefix.len() - 1];
    let start = match after {
        Some(k) => Bound::Excluded(EntityKey::Record(tenant.clone(), k.clone()).to_bytes()),
        None => Bound::Included(prefix.to_vec()),
    };
    // The tenant's record keys end before `r<tenant>\x01`.
    let mut end = prefix.to_vec();
    *end.last_mut().expect("separator") = 1;
    let end = Bound::Excluded(end);
    let mem: Vec<Vec<u8>> = shared.record_keys_in(
        (
            start.as_ref().map(Vec::as_slice),
            end.as_ref().map(Vec::as_slice),
        ),
        max,
    );
    let idx = shared.index().keys_in((start, end), max)?;
    // Each list holds every key up to its last one; a full list may stop
    // early, so the merge is only complete up to the smaller full last key.
    let mut bound: Option<&Vec<u8>> = None;
    for l in [&mem, &idx] {
        if l.len() == max {
            let last = l.last().expect("non-empty");
            bound = Some(bound.map_or(last, |b| b.min(last)));
        }
    }
    let mut keys: Vec<&Vec<u8>> = mem.iter().chain(idx.iter()).collect();
    keys.sort_unstable();
    keys.dedup();
    if let Some(b) = bound {
        keys.retain(|k| *k <= b);
    }
    let more = bound.is_some() || keys.len() > max;
    keys.truncate(max);
    let mut records = Vec::with_capacity(keys.len());
    let mut principals = Principals::new();
    for k in &keys {
        let Some(v) = shared.load(k)? else { continue };
        // Collected (`Gone`) or undecodable (counted by the gauges): not listed.
        let Value::Record(r) = &*v else { continue };
        let p = &r.reservation.principal;
        if !principals.contains(p) {
            match shared.principal(tenant, p)? {
                Ok(st) => principals.insert(p.clone(), st),
                Err(_) => {
                    records.push(r.clone());
                    continue;
                }
            };
        }
        match view_at(Some(r), &principals, now) {
            Ok(Some(view)) => records.push(view),
            Ok(None) => {}
            // Refused under §6.9: listed as stored.
            Err(_) => records.push(r.clone()),
        }
    }
    let next = match (more, keys.last()) {
        (true, Some(k)) => match EntityKey::from_bytes(k)? {
            EntityKey::Record(_, key) => Some(key),
            _ => {
                return Err(StoreError::Corrupt(
                    "a record key range held another entity".into(),
                ));
            }
        },
        _ => None,
    };
    Ok(Scan { records, next, now })
}

pub(crate) fn health_sync<I: Index>(shared: &Shared<I>, closed: bool) -> Result<(), StoreError> {
    if closed {
        return Err(StoreError::Closed);
    }
    if shared.is_poisoned() {
        return Err(StoreError::Poisoned);
    }
    if !shared.is_writer_alive() {
        return Err(StoreError::Io("the writer thread stopped".into()));
    }
    if !shared.is_checkpointer_alive() {
        return Err(StoreError::Io("the checkpointer thread stopped".into()));
    }
    Ok(())
}
