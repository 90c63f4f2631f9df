//! On-disk encodings: entity keys, versioned values and checksummed log frames.
//!
//! Every stored value starts with a format version byte; every log frame
//! carries a CRC-32 of its payload (fjall checksums its own blocks).

use serde::{Deserialize, Serialize};
use settle_core::{Key, Principal, PrincipalState, Record, TaskId, TenantId, Warning};
use settle_ledger::StoreError;

/// Version of the value and frame encodings written by this build.
/// 2: records keep each attempt's `error`, leases can end by
/// `release(not_committed)`, principals keep their newest moves (issue 8).
/// A store written in version 1 is refused on open (no converter).
pub const FORMAT_VERSION: u8 = 2;

const FRAME_MAGIC: u32 = 0x5354_4c31; // "STL1"
/// magic + payload length + crc32
pub const FRAME_HEADER: usize = 12;

/// What a log entry or index row is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EntityKey {
    Record(TenantId, Key),
    Principal(TenantId, Principal),
    Task(TenantId, TaskId),
}

impl EntityKey {
    /// Index key bytes: a kind byte, the tenant, 0x00, the name. Tenants and
    /// names are visible ASCII, so the separator is unambiguous and keys of
    /// one kind sort by tenant.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (kind, t, name) = match self {
            EntityKey::Record(t, k) => (b'r', t.as_str(), k.as_str()),
            EntityKey::Principal(t, p) => (b'p', t.as_str(), p.as_str()),
            EntityKey::Task(t, task) => (b'w', t.as_str(), task.as_str()),
        };
        let mut v = Vec::with_capacity(2 + t.len() + name.len());
        v.push(kind);
        v.extend_from_slice(t.as_bytes());
        v.push(0);
        v.extend_from_slice(name.as_bytes());
        v
    }

    pub fn from_bytes(b: &[u8]) -> Result<EntityKey, StoreError> {
        let bad =
            || StoreError::Corrupt(format!("bad entity key {:?}", String::from_utf8_lossy(b)));
        let (&kind, rest) = b.split_first().ok_or_else(bad)?;
        let sep = rest.iter().position(|&c| c == 0).ok_or_else(bad)?;
        let t = std::str::from_utf8(&rest[..sep]).map_err(|_| bad())?;
        let name = std::str::from_utf8(&rest[sep + 1..]).map_err(|_| bad())?;
        let tenant = TenantId::new(t).map_err(|_| bad())?;
        Ok(match kind {
            b'r' => EntityKey::Record(tenant, Key::new(name).map_err(|_| bad())?),
            b'p' => EntityKey::Principal(tenant, Principal::new(name).map_err(|_| bad())?),
            b'w' => EntityKey::Task(tenant, TaskId::new(name).map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }
}

/// The state of one entity; `Gone` deletes it (a collected record).
// Records are by far the common variant; boxing them would add an allocation per entity.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Value {
    Record(Record),
    Principal(PrincipalState),
    Warnings(Vec<Warning>),
    Gone,
}

/// `[version][postcard(value)]`.
pub fn encode_value(v: &Value) -> Vec<u8> {
    let out = Vec::with_capacity(512);
    let mut out = postcard::to_extend(&FORMAT_VERSION, out).expect("encoding to a Vec cannot fail");
    out = postcard::to_extend(v, out).expect("encoding to a Vec cannot fail");
    out
}

pub fn decode_value(b: &[u8]) -> Result<Value, StoreError> {
    match b.split_first() {
        Some((&FORMAT_VERSION, rest)) => {
            postcard::from_bytes(rest).map_err(|e| StoreError::Corrupt(format!("value: {e}")))
        }
        Some((v, _)) => Err(StoreError::Corrupt(format!(
            "unknown value format version {v}"
        ))),
        None => Err(StoreError::Corrupt("empty value".into())),
    }
}

/// One changed entity in a log frame. The value is kept encoded
/// ([`encode_value`]) so the checkpointer can ingest it without decoding;
/// `open` and `expires_at` are what it needs for the `open` and `expiry`
/// indexes. Decoding borrows the bytes from the segment buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry<'a> {
    /// [`EntityKey::to_bytes`].
    #[serde(borrow)]
    pub key: &'a [u8],
    /// A record that is not terminal.
    pub open: bool,
    /// A terminal record's collection time (ms).
    pub expires_at: Option<u64>,
    /// The encoded value; empty for [`Value::Gone`].
    #[serde(borrow)]
    pub value: &'a [u8],
}

impl<'a> Entry<'a> {
    /// Describes `value` (already encoded as `encoded`) for the log.
    pub fn new(key: &'a [u8], value: &Value, encoded: &'a [u8]) -> Entry<'a> {
        let (open, expires_at) = match value {
            Value::Record(r) => (!r.status.is_terminal(), r.expires_at().map(|t| t.millis())),
            _ => (false, None),
        };
        Entry {
            key,
            open,
            expires_at,
            value: encoded,
        }
    }

    /// The entity's state.
    pub fn decode(&self) -> Result<Value, StoreError> {
        if self.value.is_empty() {
            Ok(Value::Gone)
        } else {
            decode_value(self.value)
        }
    }
}

/// One group commit: everything that changed in one batch, at its final state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch<'a> {
    pub version: u8,
    /// Log sequence number of this batch (strictly increasing, across restarts too).
    pub lsn: u64,
    /// The fence counter after this batch: fences below it were granted.
    pub next_fence: u64,
    #[serde(borrow)]
    pub entries: Vec<Entry<'a>>,
}

/// Encodes a value for the log and the index; `Gone` is the empty blob.
pub fn encode_for_log(v: &Value) -> Vec<u8> {
    match v {
        Value::Gone => Vec::new(),
        v => encode_value(v),
    }
}

/// Appends one frame (header + postcard payload) to `out`.
pub fn encode_frame(batch: &Batch<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER]);
    let taken = std::mem::take(out);
    *out = postcard::to_extend(batch, taken).expect("encoding to a Vec cannot fail");
    let len = (out.len() - start - FRAME_HEADER) as u32;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER..]);
    out[start..start + 4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// Result of reading one frame at the start of `buf`.
pub enum Frame<'a> {
    /// A whole, checksummed frame and its length in bytes.
    Ok(Batch<'a>, usize),
    /// Nothing more: end of data, or a torn/garbage tail.
    End,
}

/// Decodes the frame at the start of `buf`. A short, torn or checksum-failing
/// frame reads as [`Frame::End`]: the caller decides whether that may be a torn tail.
pub fn decode_frame(buf: &[u8]) -> Result<Frame<'_>, StoreError> {
    if buf.len() < FRAME_HEADER {
        return Ok(Frame::End);
    }
    let magic = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    let len = u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(buf[8..12].try_into().unwrap());
    if magic != FRAME_MAGIC || buf.len() < FRAME_HEADER + len {
        return Ok(Frame::End);
    }
    let payload = &buf[FRAME_HEADER..FRAME_HEADER + len];
    if crc32fast::hash(payload) != crc {
        return Ok(Frame::End);
    }
    let batch: Batch<'_> = postcard::from_bytes(payload)
        .map_err(|e| StoreError::Corrupt(format!("log frame: {e}")))?;
    if batch.version != FORMAT_VERSION {
        return Err(StoreError::Corrupt(format!(
            "unknown log format version {}",
            batch.version
        )));
    }
    Ok(Frame::Ok(batch, FRAME_HEADER + len))
}

/// Every whole frame at the start of `buf`, and the byte length they cover.
pub fn decode_frames(buf: &[u8]) -> Result<(Vec<Batch<'_>>, usize), StoreError> {
    let mut pos = 0usize;
    let mut batches = Vec::new();
    while let Frame::Ok(b, len) = decode_frame(&buf[pos..])? {
        batches.push(b);
        pos += len;
    }
    Ok((batches, pos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_core::testkit::*;
    use settle_core::{Command, Timestamp, World};

    fn sample_record() -> Record {
        let mut w = World::default();
        let t = TenantId::default_tenant();
        let now = Timestamp(1_700_000_000_000);
        let f = match w
            .execute(&t, &claim("k", 1, binding("alice", 0)), now)
            .reply
        {
            settle_core::Reply::Claim(d) => d.grant().unwrap().fence,
            r => panic!("{r:?}"),
        };
        w.execute(
            &t,
            &settle("k", f, 1, binding("alice", 0), completed(1)),
            now,
        );
        let _ = Command::Expire { key: key("k") };
        w.records.values().next().unwrap().clone()
    }

    #[test]
    fn values_roundtrip_with_version_byte() {
        let r = sample_record();
        let b = encode_value(&Value::Record(r.clone()));
        assert_eq!(b[0], FORMAT_VERSION);
        assert_eq!(decode_value(&b).unwrap(), Value::Record(r));
        let mut bad = b.clone();
        bad[0] = 99;
        assert!(decode_value(&bad).is_err());
    }

    #[test]
    fn entity_keys_roundtrip() {
        let k = EntityKey::Record(TenantId::new("acme").unwrap(), key("order-1"));
        assert_eq!(EntityKey::from_bytes(&k.to_bytes()).unwrap(), k);
        let p = EntityKey::Principal(
            TenantId::new("acme").unwrap(),
            Principal::new("bob").unwrap(),
        );
        assert_eq!(EntityKey::from_bytes(&p.to_bytes()).unwrap(), p);
    }

    #[test]
    fn frames_detect_torn_and_corrupt_tails() {
        let k = EntityKey::Record(TenantId::default_tenant(), key("k")).to_bytes();
        let v = Value::Record(sample_record());
        let blob = encode_for_log(&v);
        let entry = Entry::new(&k, &v, &blob);
        assert!(!entry.open);
        assert!(entry.expires_at.is_some());
        let batch = Batch {
            version: FORMAT_VERSION,
            lsn: 7,
            next_fence: 3,
            entries: vec![entry],
        };
        let mut buf = Vec::new();
        encode_frame(&batch, &mut buf);
        let n = buf.len();
        match decode_frame(&buf).unwrap() {
            Frame::Ok(b, len) => {
                assert_eq!(b, batch);
                assert_eq!(b.entries[0].decode().unwrap(), v);
                assert_eq!(len, n);
            }
            Frame::End => panic!("whole frame"),
        }
        for cut in [0, 5, FRAME_HEADER, n - 1] {
            assert!(matches!(decode_frame(&buf[..cut]).unwrap(), Frame::End));
        }
        let mut flipped = buf.clone();
        flipped[n - 3] ^= 0x40;
        assert!(matches!(decode_frame(&flipped).unwrap(), Frame::End));
    }
}
