//! Reading a stopped store's data directory offline ([`scan`], behind
//! `settle inspect` and `settle check`).

use std::collections::HashSet;
use std::path::Path;

use dashmap::DashMap;
use settle_core::{Record, TenantId};
use settle_ledger::StoreError;

use crate::codec::{EntityKey, Value, decode_value};
use crate::fs::{Fs, OsFs};
use crate::index::{FjallIndex, Index};
use crate::open::io;
use crate::recovery::{self, Recovered};
use crate::{Hasher, Slot};

/// What [`scan`] found besides the records.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// Stored values that do not decode (`tenant/key: reason`).
    pub undecodable: Vec<String>,
    /// A torn tail left by a crash (never acknowledged; cut at the next open).
    pub torn_tail: Option<String>,
}

/// Reads a stopped store offline, calling `f` for every stored record, open
/// or settled. Read-only: it recovers into memory and changes nothing on
/// disk (a torn tail stays, a store recovery would refuse is refused with
/// the same error and left as it is).
pub fn scan(
    dir: impl AsRef<Path>,
    mut f: impl FnMut(&TenantId, &Record),
) -> Result<ScanReport, StoreError> {
    let dir = dir.as_ref();
    if !dir.join("wal").is_dir() || !dir.join("index").is_dir() {
        return Err(StoreError::Io(format!(
            "{} is not a settle data directory (no wal/ and index/)",
            dir.display()
        )));
    }
    let _lock = OsFs.lock(&dir.join("LOCK")).map_err(io)?;
    let index = FjallIndex::open(&dir.join("index"))?;
    let rec = recovery::recover(&OsFs, &dir.join("wal"), &index)?;
    let mut report = ScanReport {
        torn_tail: rec
            .torn
            .as_ref()
            .map(|(p, from, to)| format!("{} bytes {from}..{to}", p.display())),
        ..ScanReport::default()
    };
    let mut seen: HashSet<Box<[u8]>> = HashSet::new();
    let map: &DashMap<Box<[u8]>, Slot, Hasher> = &rec.map;
    for s in map.iter() {
        match &*s.value {
            Value::Record(r) => {
                if let EntityKey::Record(t, _) = EntityKey::from_bytes(s.key())? {
                    f(&t, r);
                }
            }
            Value::Undecodable(e) => report
                .undecodable
                .push(format!("{}: {e}", Recovered::describe(s.key()))),
            _ => {}
        }
        seen.insert(s.key().clone());
    }
    index.for_each(&mut |k, v| {
        if seen.contains(k) {
            return;
        }
        match decode_value(v) {
            Ok(Value::Record(r)) => {
                if let Ok(EntityKey::Record(t, _)) = EntityKey::from_bytes(k) {
                    f(&t, &r);
                }
            }
            Ok(_) => {}
            Err(e) => report
                .undecodable
                .push(format!("{}: {e}", Recovered::describe(k))),
        }
    })?;
    Ok(report)
}
