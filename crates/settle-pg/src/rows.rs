//! What both write paths read from and write to their rows: the
//! per-command path (`command.rs`, one transaction per command) and the
//! group-commit path (`group_commit/`, one transaction per gathered
//! group). Their SQL differs (scalar parameters and a `SELECT … FOR UPDATE`
//! there, arrays and one compare-and-set statement here); what a row holds
//! and what is made of it are the same, and live here once.

use settle_core::{Fence, Key, Record, TenantId};
use tokio_postgres::Row;

use crate::PgError;
use crate::codec::{self, FORMAT, RecordColumns};
use crate::state::{Inner, check_durability};

/// The values a record's row is written with: the format this build
/// writes, the encoded record and the columns derived from it.
pub struct RecordRow {
    pub format: i16,
    pub value: Vec<u8>,
    pub cols: RecordColumns,
}

impl RecordRow {
    pub fn of(r: &Record) -> Result<RecordRow, PgError> {
        Ok(RecordRow {
            format: FORMAT,
            value: codec::encode(r)?,
            cols: RecordColumns::of(r),
        })
    }
}

/// The record a loaded row holds (`None` for no row or a placeholder). A
/// record that does not decode is never treated as absent (the key could
/// be claimed again), never written over: it is remembered as refused
/// (`record_refused`) and the error returned.
pub fn loaded_record(
    inner: &Inner,
    tenant: &TenantId,
    key: &Key,
    format: Option<i16>,
    value: Option<&[u8]>,
) -> Result<Option<Record>, PgError> {
    let rec = codec::decode_record(format, value);
    if let Err(e) = &rec {
        inner.refuse_undecodable(tenant, key, e);
    }
    rec
}

/// The database clock (ms) a load read in its first row (column 0), after
/// checking the durability settings it read beside it (column 1), and
/// whether a synchronous standby must confirm commits.
pub fn loaded_clock(first: &Row) -> Result<(i64, bool), PgError> {
    let db_now: i64 = first.get(0);
    let durability: String = first.get(1);
    let standby = check_durability(&durability)?;
    Ok((db_now, standby))
}

/// Why a claim may not take `next`: the fence sequence is not above the
/// record's last fence (restored from an older backup, say); refused
/// rather than hand out a fence twice.
pub fn fence_behind(next: Fence, record: Option<&Record>) -> Option<String> {
    let last = record.and_then(|r| r.last_fence())?;
    (next <= last).then(|| {
        format!(
            "fence sequence at {} is not above the record's fence {}",
            next.0, last.0
        )
    })
}
