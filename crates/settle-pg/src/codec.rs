//! How records and warnings are stored: a format number column plus the
//! value's bytes, so a later format can be read side by side with this one.

use serde::Serialize;
use serde::de::DeserializeOwned;
use settle_core::{Move, PrincipalState, Record, Timestamp, Warning};

use crate::PgError;

/// postcard (compact binary serde) of the core's types. Timestamps are
/// integer milliseconds and digests raw bytes in this format. Format 1 is
/// the layout before attempts kept their `error`, leases could end by
/// `release(not_committed)` and results were kept as sent: records in it
/// are refused (there is no converter); warnings did not change and are read.
pub const FORMAT_POSTCARD_V1: i16 = 1;
/// The same encoding of the layout before leases kept their `claim_id`:
/// records in it are read through `settle_core::legacy::v2`.
pub const FORMAT_POSTCARD_V2: i16 = 2;
/// The same encoding of the current layout: leases keep the `claim_id` of
/// their claim (SPEC §4 rule 5a).
pub const FORMAT_POSTCARD_V3: i16 = 3;
/// The format this build writes.
pub const FORMAT: i16 = FORMAT_POSTCARD_V3;
/// The record formats this build reads (a row in another one is refused,
/// never taken for absent), as an SQL list: the sweep's and the stats'
/// queries select by it.
pub const READ_FORMATS_SQL: &str = "2, 3";

/// Whether this build reads records of `format`.
pub fn reads_format(format: i16) -> bool {
    matches!(format, FORMAT_POSTCARD_V2 | FORMAT_POSTCARD_V3)
}

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, PgError> {
    postcard::to_allocvec(value).map_err(|e| PgError::Corrupt(format!("cannot encode: {e}")))
}

pub fn decode<T: DeserializeOwned>(what: &str, format: i16, bytes: &[u8]) -> Result<T, PgError> {
    match format {
        FORMAT => postcard::from_bytes(bytes)
            .map_err(|e| PgError::Corrupt(format!("{what} does not decode: {e}"))),
        // Fail closed: a row written by another build is never guessed at.
        other => Err(PgError::Corrupt(format!(
            "{what} has format {other}; this build reads format {FORMAT}"
        ))),
    }
}

pub fn decode_record(format: Option<i16>, value: Option<&[u8]>) -> Result<Option<Record>, PgError> {
    match (format, value) {
        (Some(FORMAT_POSTCARD_V2), Some(v)) => {
            decode::<settle_core::legacy::v2::Record>("record", FORMAT, v).map(|r| Some(r.into()))
        }
        (Some(f), Some(v)) => decode("record", f, v).map(Some),
        // A placeholder row (inserted to lock a key that had no record) is no record.
        _ => Ok(None),
    }
}

pub fn decode_warnings(format: Option<i16>, value: Option<&[u8]>) -> Result<Vec<Warning>, PgError> {
    match (format, value) {
        // Warnings kept their layout in formats 2 and 3.
        (Some(FORMAT_POSTCARD_V1 | FORMAT_POSTCARD_V2), Some(v)) => decode("warnings", FORMAT, v),
        (Some(f), Some(v)) => decode("warnings", f, v),
        _ => Ok(Vec::new()),
    }
}

/// The columns derived from a record, for indexed queries (sweep, stats).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordColumns {
    pub owner: String,
    pub status: i16,
    pub reconcile: bool,
    /// Expiry of the open lease (none when no lease is open).
    pub lease_expires_at: Option<i64>,
    /// Generation of the open lease, as decimal text (u64 does not fit int8).
    pub lease_generation: Option<String>,
    pub updated_at: i64,
    /// When a terminal record may be collected.
    pub collect_at: Option<i64>,
    /// The latest receipt's `committed_at` (SPEC §6.9 detection in stats).
    pub receipt_at: Option<i64>,
    /// The record is disputed (the gauge counted from the store).
    pub disputed: bool,
}

fn ms(t: settle_core::Timestamp) -> i64 {
    i64::try_from(t.millis()).unwrap_or(i64::MAX)
}

impl RecordColumns {
    pub fn of(r: &Record) -> RecordColumns {
        let open = r.open_lease();
        RecordColumns {
            owner: r.reservation.principal.as_str().to_string(),
            status: i16::from(r.status.rank()),
            reconcile: r.reconcile_required,
            lease_expires_at: open.map(|l| ms(l.expires_at)),
            lease_generation: open.map(|l| l.generation.to_string()),
            updated_at: ms(r.updated_at),
            collect_at: if r.status.is_terminal() {
                r.expires_at().map(ms)
            } else {
                None
            },
            receipt_at: r.latest_receipt_at().map(ms),
            disputed: r.disputed,
        }
    }
}

/// The columns of a principal's row: the generation as decimal text
/// (`numeric(20,0)`: a u64 does not fit `bigint`), the latest move (ms) and
/// the newest moves (a `Move` list in [`FORMAT`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PrincipalColumns {
    pub generation: String,
    pub moved_at: i64,
    pub moves: Vec<u8>,
}

impl PrincipalColumns {
    pub fn of(st: &PrincipalState) -> Result<PrincipalColumns, PgError> {
        Ok(PrincipalColumns {
            generation: st.generation.to_string(),
            moved_at: st.moved_at.millis() as i64,
            moves: encode(&st.moves())?,
        })
    }
}

/// A principal from its row's columns; no row is generation 0.
pub fn principal_state(
    gen_text: Option<String>,
    moved_at: Option<i64>,
    moves: Option<Vec<u8>>,
) -> Result<PrincipalState, PgError> {
    match (gen_text, moved_at) {
        (Some(g), Some(m)) => {
            let generation = g
                .parse()
                .map_err(|_| PgError::Corrupt(format!("principal generation {g:?}")))?;
            // Rows written before schema version 2 have no moves: the
            // latest move is then the only one known.
            let moves: Vec<Move> = match moves {
                Some(b) => decode("principal moves", FORMAT, &b)?,
                None => Vec::new(),
            };
            Ok(PrincipalState::with_moves(
                generation,
                Timestamp(m.max(0) as u64),
                &moves,
            ))
        }
        _ => Ok(PrincipalState::default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_core::testkit::*;
    use settle_core::{Command, Fence, Reply, TaskId, TenantId, Text, Timestamp, Warn, World};

    #[test]
    fn a_busy_record_roundtrips() {
        let mut w = World::default();
        let t = TenantId::new("acme").unwrap();
        let now = Timestamp(1_700_000_000_000);
        let Reply::Claim(d) = w
            .execute(
                &t,
                &claim_with("k", 1, binding("alice", 2), 1000, true),
                now,
            )
            .reply
        else {
            panic!()
        };
        let f = d.grant().unwrap().fence;
        w.execute(&t, &dispatch("k", f), now);
        // Quarantine, an unknown receipt, a reconcile lease, a terminal receipt.
        w.execute(
            &t,
            &settle("k", Fence(99), 1, binding("bob", 2), completed(1)),
            now,
        );
        w.execute(&t, &settle("k", f, 1, binding("alice", 2), unknown()), now);
        let Reply::Claim(d) = w
            .execute(&t, &claim("k", 1, binding("alice", 2)), now)
            .reply
        else {
            panic!()
        };
        let g = d.grant().unwrap().fence;
        w.execute(
            &t,
            &reconcile("k", g, committed(1, binding("alice", 2), failed(3))),
            now.plus_ms(5),
        );
        let r = w.records.values().next().unwrap().clone();
        assert!(r.receipt.is_some() && !r.quarantine.is_empty());
        let bytes = encode(&r).unwrap();
        let back: Record = decode("record", FORMAT, &bytes).unwrap();
        assert!(decode::<Record>("record", FORMAT_POSTCARD_V1, &bytes).is_err());
        assert_eq!(back, r);
        let cols = RecordColumns::of(&r);
        assert_eq!(cols.status, 3);
        assert_eq!(cols.lease_expires_at, None);
        assert_eq!(
            cols.collect_at,
            Some((now.plus_ms(5).millis() + 86_400_000) as i64)
        );
    }

    #[test]
    fn warnings_roundtrip_and_unknown_formats_fail_closed() {
        let mut w = World::default();
        let t = TenantId::new("acme").unwrap();
        let cmd = Command::Warn(Warn {
            task: TaskId::new("task").unwrap(),
            class: settle_core::WarningClass::new("c").unwrap(),
            detail: Some(Text::new("detail", "x").unwrap()),
        });
        w.execute(&t, &cmd, Timestamp(5));
        let ws = w.warnings(&t, &TaskId::new("task").unwrap());
        let bytes = encode(&ws).unwrap();
        assert_eq!(decode_warnings(Some(FORMAT), Some(&bytes)).unwrap(), ws);
        assert!(matches!(
            decode::<Vec<Warning>>("warnings", 4, &bytes),
            Err(PgError::Corrupt(_))
        ));
        assert!(decode_record(Some(FORMAT), Some(&[0xff, 0xff])).is_err());
        assert_eq!(decode_record(None, None).unwrap(), None);
    }
}
