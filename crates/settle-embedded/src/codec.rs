//! On-disk encodings: entity keys, versioned values and checksummed log frames.
//!
//! Every stored value starts with a format version byte; every log frame
//! carries a CRC-32 of its payload (fjall checksums its own blocks).

use serde::{Deserialize, Serialize};
use settle_core::{Key, Principal, PrincipalState, Record, TaskId, TenantId, Warning};
use settle_ledger::StoreError;

/// Version of the value encoding written by this build.
/// 2: records keep each attempt's `error`, leases can end by
/// `release(not_committed)`, principals keep their newest moves.
/// 3: leases keep the `claim_id` of their claim (SPEC §4 rule 5a).
/// Values of version 2 are read through `settle_core::legacy::v2` (their
/// leases have no `claim_id`); a store written in version 1 is refused on
/// open (no converter).
pub const FORMAT_VERSION: u8 = 3;
/// The previous value encoding, still read.
pub const FORMAT_VERSION_2: u8 = 2;
/// Version of the log frame encoding (2: checksummed header bound to its
/// segment and offset, the disputed count in every batch).
pub const FRAME_VERSION: u8 = 2;

const FRAME_MAGIC: u32 = 0x5354_4c32; // "STL2"
/// The magic of format-1 frames (before the header checksum), recognised
/// only to refuse them clearly instead of taking them for a torn tail.
pub const FRAME_MAGIC_V1: u32 = 0x5354_4c31;
/// magic + payload length + payload crc32 + header crc32
pub const FRAME_HEADER: usize = 16;

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
            EntityKey::Record(t, k) => (KIND_RECORD, t, k.as_str()),
            EntityKey::Principal(t, p) => (KIND_PRINCIPAL, t, p.as_str()),
            EntityKey::Task(t, task) => (KIND_TASK, t, task.as_str()),
        };
        let mut v = Vec::with_capacity(2 + t.as_str().len() + name.len());
        entity_key_into(kind, t, name, &mut v);
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

/// The kind byte of a record's, a principal's and a task's key.
pub const KIND_RECORD: u8 = b'r';
pub const KIND_PRINCIPAL: u8 = b'p';
pub const KIND_TASK: u8 = b'w';

/// Appends the key bytes of [`EntityKey::to_bytes`] for an entity of
/// `kind` to `out`, without building an [`EntityKey`] (two `Arc` clones)
/// first: the writer keys every command.
pub fn entity_key_into(kind: u8, tenant: &TenantId, name: &str, out: &mut Vec<u8>) {
    out.push(kind);
    out.extend_from_slice(tenant.as_str().as_bytes());
    out.push(0);
    out.extend_from_slice(name.as_bytes());
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
    /// In memory only, never written: a stored value that does not decode
    /// (its bytes stay where they are). Every command on its key is
    /// refused, and it is never taken for absent.
    #[serde(skip)]
    Undecodable(std::sync::Arc<str>),
}

/// `[version][postcard(value)]`.
// The writer encodes with `encode_frame_of`; tests and fuzz/ use this.
#[cfg_attr(not(test), allow(dead_code))]
pub fn encode_value(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    append_value(v, &mut out);
    out
}

/// Appends `[version][postcard(value)]` to `out`.
fn append_value(v: &Value, out: &mut Vec<u8>) {
    out.push(FORMAT_VERSION);
    match v {
        // The writer's common case, without serde (crate::record_codec).
        Value::Record(r) => {
            let start = out.len();
            out.push(VALUE_RECORD);
            crate::record_codec::record(out, r);
            debug_assert_eq!(
                &out[start..],
                &postcard::to_allocvec(v).expect("encoding to a Vec cannot fail")[..],
                "record_codec wrote other bytes than postcard"
            );
        }
        _ => postcard::serialize_with_flavor(v, AppendTo(out))
            .expect("encoding to a Vec cannot fail"),
    }
}

/// The variant index postcard writes for [`Value::Record`].
pub(crate) const VALUE_RECORD: u8 = 0;

/// A postcard flavor appending to a borrowed `Vec` (postcard's own
/// `to_extend` pushes through `Extend` and moves the buffer in and out).
struct AppendTo<'a>(&'a mut Vec<u8>);

impl postcard::ser_flavors::Flavor for AppendTo<'_> {
    type Output = ();

    fn try_push(&mut self, b: u8) -> postcard::Result<()> {
        self.0.push(b);
        Ok(())
    }

    fn try_extend(&mut self, b: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(b);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends `n` as postcard writes every integer but `u8`: LEB128. (All
/// ten groups written at once and the append cut to length was tried:
/// it took more instructions.)
pub(crate) fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// How many bytes [`put_varint`] writes for `n`.
fn varint_len(n: u64) -> usize {
    (64 - (n | 1).leading_zeros() as usize).div_ceil(7)
}

/// [`Value`] as format 2 wrote it: records without `claim_id`s.
// Read once per value and converted at once; the same layout as `Value`.
#[allow(clippy::large_enum_variant)]
#[derive(Deserialize)]
enum ValueV2 {
    Record(settle_core::legacy::v2::Record),
    Principal(PrincipalState),
    Warnings(Vec<Warning>),
    Gone,
}

impl From<ValueV2> for Value {
    fn from(v: ValueV2) -> Value {
        match v {
            ValueV2::Record(r) => Value::Record(r.into()),
            ValueV2::Principal(p) => Value::Principal(p),
            ValueV2::Warnings(w) => Value::Warnings(w),
            ValueV2::Gone => Value::Gone,
        }
    }
}

pub fn decode_value(b: &[u8]) -> Result<Value, StoreError> {
    match b.split_first() {
        Some((&FORMAT_VERSION, rest)) => {
            postcard::from_bytes(rest).map_err(|e| StoreError::Corrupt(format!("value: {e}")))
        }
        Some((&FORMAT_VERSION_2, rest)) => postcard::from_bytes::<ValueV2>(rest)
            .map(Value::from)
            .map_err(|e| StoreError::Corrupt(format!("value (format 2): {e}"))),
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

/// What a log entry says besides the value: (`open`, `expires_at`).
pub(crate) fn describe(value: &Value) -> (bool, Option<u64>) {
    match value {
        Value::Record(r) => (!r.status.is_terminal(), r.expires_at().map(|t| t.millis())),
        _ => (false, None),
    }
}

impl<'a> Entry<'a> {
    /// Describes `value` (already encoded as `encoded`) for the log.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn new(key: &'a [u8], value: &Value, encoded: &'a [u8]) -> Entry<'a> {
        let (open, expires_at) = describe(value);
        Entry {
            key,
            open,
            expires_at,
            value: encoded,
        }
    }

    /// The entity's state.
    #[cfg(test)]
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
    /// Log sequence number of this batch: consecutive, across segments and restarts.
    pub lsn: u64,
    /// The fence counter after this batch: fences below it were granted.
    pub next_fence: u64,
    /// Records marked `disputed` in the whole store after this batch.
    pub disputed: u64,
    #[serde(borrow)]
    pub entries: Vec<Entry<'a>>,
}

/// Encodes a value for the log and the index; `Gone` is the empty blob.
// The writer encodes with `encode_frame_of`; tests and fuzz/ use this.
#[cfg_attr(not(test), allow(dead_code))]
pub fn encode_for_log(v: &Value) -> Vec<u8> {
    match v {
        Value::Gone => Vec::new(),
        Value::Undecodable(_) => unreachable!("an undecodable value is never written"),
        v => encode_value(v),
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The header checksum covers the magic, the length and the payload
/// checksum, and is bound to where the frame lives (segment and offset):
/// a frame-shaped byte string anywhere else (inside a result, say) never
/// reads as a valid frame.
fn header_crc(seq: u64, offset: u64, header: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(&offset.to_le_bytes());
    h.update(&header[..12]);
    h.finalize()
}

/// Appends one frame (header + postcard payload) to `out`. Its header
/// checksum is written by [`place_frame`] once its position is known.
// The writer encodes with `encode_frame_of`; tests and fuzz/ use this.
#[cfg_attr(not(test), allow(dead_code))]
pub fn encode_frame(batch: &Batch<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER]);
    postcard::serialize_with_flavor(batch, AppendTo(out)).expect("encoding to a Vec cannot fail");
    finish_header(out, start);
}

/// Appends the frame of one batch to `out`, encoding each value straight
/// into it: the same bytes as [`encode_frame`] of the [`Batch`] whose
/// entries are `entries` (keys and values as [`encode_for_log`] writes
/// them), without a buffer per value and a copy, and with the byte strings
/// copied whole (serde writes a `&[u8]` field byte by byte). Its header
/// checksum is written by [`place_frame`] once its position is known.
pub fn encode_frame_of<'v>(
    lsn: u64,
    next_fence: u64,
    disputed: u64,
    entries: impl ExactSizeIterator<Item = (&'v [u8], &'v Value)>,
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER]);
    // The fields of `Batch`, in order, as postcard writes them.
    out.push(FRAME_VERSION);
    put_varint(out, lsn);
    put_varint(out, next_fence);
    put_varint(out, disputed);
    let count = entries.len();
    put_varint(out, count as u64);
    let mut written = 0;
    for (key, value) in entries {
        // The fields of `Entry`, in order.
        put_varint(out, key.len() as u64);
        out.extend_from_slice(key);
        let (open, expires_at) = describe(value);
        out.push(open as u8);
        match expires_at {
            None => out.push(0),
            Some(t) => {
                out.push(1);
                put_varint(out, t);
            }
        }
        match value {
            Value::Gone => out.push(0),
            Value::Undecodable(_) => unreachable!("an undecodable value is never written"),
            v => {
                // The value's length goes before it: leave room for the
                // usual two bytes (128 B to 16 KiB), move it if it is not.
                const GUESS: usize = 2;
                let at = out.len();
                out.extend_from_slice(&[0; GUESS]);
                append_value(v, out);
                let len = out.len() - at - GUESS;
                let need = varint_len(len as u64);
                if need != GUESS {
                    let mut prefix = Vec::with_capacity(need);
                    put_varint(&mut prefix, len as u64);
                    out.splice(at..at + GUESS, prefix);
                } else {
                    out[at] = len as u8 | 0x80;
                    out[at + 1] = (len >> 7) as u8;
                }
            }
        }
        written += 1;
    }
    assert_eq!(written, count, "the frame's entry count was written first");
    finish_header(out, start);
}

/// Fills in the magic, the payload length and its checksum of the frame
/// starting at `start` (the rest of `out`).
fn finish_header(out: &mut [u8], start: usize) {
    let len = (out.len() - start - FRAME_HEADER) as u32;
    let crc = crc32fast::hash(&out[start + FRAME_HEADER..]);
    out[start..start + 4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// The batch number of an encoded frame (as [`encode_frame_of`] wrote it,
/// whatever its placement): what the log checks before it writes a frame.
pub fn frame_lsn(frame: &[u8]) -> Option<u64> {
    if frame.len() <= FRAME_HEADER
        || le32(&frame[0..4]) != FRAME_MAGIC
        || frame[FRAME_HEADER] != FRAME_VERSION
    {
        return None;
    }
    postcard::take_from_bytes::<u64>(&frame[FRAME_HEADER + 1..])
        .ok()
        .map(|(lsn, _)| lsn)
}

/// Seals the header of the frame at the start of `frame` for byte
/// `offset` of segment `seq`.
pub fn place_frame(frame: &mut [u8], seq: u64, offset: u64) {
    let crc = header_crc(seq, offset, frame);
    frame[12..16].copy_from_slice(&crc.to_le_bytes());
}

/// The length of the frame whose header is at the start of `buf`, if that
/// header is intact (magic, length and checksum, for this position).
pub fn frame_extent(buf: &[u8], seq: u64, offset: u64) -> Option<usize> {
    if buf.len() < FRAME_HEADER
        || le32(&buf[0..4]) != FRAME_MAGIC
        || le32(&buf[12..16]) != header_crc(seq, offset, buf)
    {
        return None;
    }
    Some(FRAME_HEADER + le32(&buf[4..8]) as usize)
}

/// Result of reading one frame at the start of `buf`.
pub enum Frame<'a> {
    /// A whole, checksummed frame and its length in bytes.
    Ok(Batch<'a>, usize),
    /// No whole frame here: end of data, a torn write, or damage. `extent`
    /// is the frame's length when its header is intact.
    Bad { extent: Option<usize> },
}

/// Decodes the frame at the start of `buf`, which is byte `offset` of
/// segment `seq`. A short, torn or checksum-failing frame reads as
/// [`Frame::Bad`]: the caller decides whether that may be a torn tail. A
/// frame whose checksums hold but whose content does not decode is damage
/// no torn write explains: an error.
pub fn decode_frame(buf: &[u8], seq: u64, offset: u64) -> Result<Frame<'_>, StoreError> {
    let Some(extent) = frame_extent(buf, seq, offset) else {
        return Ok(Frame::Bad { extent: None });
    };
    if buf.len() < extent || crc32fast::hash(&buf[FRAME_HEADER..extent]) != le32(&buf[8..12]) {
        return Ok(Frame::Bad {
            extent: Some(extent),
        });
    }
    let at = || format!("segment {seq} byte {offset}");
    let batch: Batch<'_> = postcard::from_bytes(&buf[FRAME_HEADER..extent])
        .map_err(|e| StoreError::Corrupt(format!("log frame at {}: {e}", at())))?;
    if batch.version != FRAME_VERSION {
        return Err(StoreError::Corrupt(format!(
            "log frame at {}: unknown log format version {} (this build reads {FRAME_VERSION})",
            at(),
            batch.version
        )));
    }
    Ok(Frame::Ok(batch, extent))
}

/// The whole frames at the start of segment `seq`'s bytes, where they end,
/// and the extent of the frame header found there if it is intact.
pub struct Frames<'a> {
    pub batches: Vec<Batch<'a>>,
    /// Where each batch's frame starts.
    pub starts: Vec<usize>,
    /// Byte offset after the last whole frame.
    pub valid: usize,
    /// Length of the (torn or damaged) frame at `valid`, if its header is intact.
    pub bad_extent: Option<usize>,
}

pub fn decode_frames(buf: &[u8], seq: u64) -> Result<Frames<'_>, StoreError> {
    let mut pos = 0usize;
    let mut batches = Vec::new();
    let mut starts = Vec::new();
    loop {
        match decode_frame(&buf[pos..], seq, pos as u64)? {
            Frame::Ok(b, len) => {
                batches.push(b);
                starts.push(pos);
                pos += len;
            }
            Frame::Bad { extent } => {
                return Ok(Frames {
                    batches,
                    starts,
                    valid: pos,
                    bad_extent: extent,
                });
            }
        }
    }
}

/// The first offset at or after `from` where an intact frame header of
/// segment `seq` starts (a frame was written there).
pub fn find_frame_header(buf: &[u8], seq: u64, from: usize) -> Option<usize> {
    let magic = FRAME_MAGIC.to_le_bytes();
    let mut i = from;
    while i + FRAME_HEADER <= buf.len() {
        if buf[i..i + 4] == magic && frame_extent(&buf[i..], seq, i as u64).is_some() {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_core::testkit::*;
    use settle_core::{Command, Timestamp, World};

    #[test]
    fn frame_lsn_reads_the_batch_number_of_an_encoded_frame() {
        for lsn in [1u64, 127, 128, 1 << 40] {
            let mut buf = Vec::new();
            encode_frame_of(lsn, 9, 0, std::iter::empty(), &mut buf);
            assert_eq!(frame_lsn(&buf), Some(lsn));
            place_frame(&mut buf, 3, 4096);
            assert_eq!(frame_lsn(&buf), Some(lsn), "placement keeps it");
        }
        assert_eq!(frame_lsn(&[0u8; 40]), None, "no magic, no number");
    }

    /// A format-2 value (leases without `claim_id`) reads back as today's
    /// record with no `claim_id`, and re-encodes as format 3: one byte
    /// longer per attempt (the `claim_id` tag), which fuzz/'s
    /// `check_value` allows (fuzz found it assumed no growth).
    #[test]
    fn a_format_2_value_reads_back_and_grows_one_byte_per_attempt() {
        let r = without_claim_ids(full_record());
        assert!(!r.attempts.is_empty());
        let mut old = vec![FORMAT_VERSION_2, VALUE_RECORD];
        old.extend(postcard::to_allocvec(&settle_core::legacy::v2::Record::from(&r)).unwrap());
        let back = decode_value(&old).expect("format 2 is still read");
        assert_eq!(back, Value::Record(r.clone()));
        let enc = encode_value(&back);
        assert_eq!(enc[0], FORMAT_VERSION);
        assert_eq!(enc.len(), old.len() + r.attempts.len());
    }

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

    proptest::proptest! {
        /// `put_varint` writes what postcard writes for a `u64`, at every
        /// length (each bit width equally likely, both ends included),
        /// after bytes already in the buffer.
        #[test]
        fn varints_are_postcards(bits in 0u32..=64, low in proptest::prelude::any::<u64>(), head in 0usize..3) {
            let n = match bits {
                0 => 0,
                64 => u64::MAX - (low & 1),
                b => (1u64 << (b - 1)) | (low & ((1u64 << (b - 1)) - 1)),
            };
            let mut out = vec![0xee; head];
            put_varint(&mut out, n);
            let want = postcard::to_allocvec(&n).unwrap();
            proptest::prop_assert_eq!(&out[..head], &vec![0xee; head][..]);
            proptest::prop_assert_eq!(&out[head..], &want[..]);
            proptest::prop_assert_eq!(varint_len(n), want.len());
        }
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

    fn sample_frame(lsn: u64) -> (Vec<u8>, Value) {
        let k = EntityKey::Record(TenantId::default_tenant(), key("k")).to_bytes();
        let v = Value::Record(sample_record());
        let blob = encode_for_log(&v);
        let batch = Batch {
            version: FRAME_VERSION,
            lsn,
            next_fence: 3,
            disputed: 0,
            entries: vec![Entry::new(&k, &v, &blob)],
        };
        let mut buf = Vec::new();
        encode_frame(&batch, &mut buf);
        (buf, v)
    }

    #[test]
    fn frames_detect_torn_and_corrupt_tails() {
        let (mut buf, v) = sample_frame(7);
        place_frame(&mut buf, 1, 0);
        let n = buf.len();
        match decode_frame(&buf, 1, 0).unwrap() {
            Frame::Ok(b, len) => {
                assert_eq!(b.lsn, 7);
                assert!(!b.entries[0].open);
                assert!(b.entries[0].expires_at.is_some());
                assert_eq!(b.entries[0].decode().unwrap(), v);
                assert_eq!(len, n);
            }
            Frame::Bad { .. } => panic!("whole frame"),
        }
        // Cut inside the header: nothing known; cut after it: the extent is known.
        for cut in [0, 5, FRAME_HEADER - 1] {
            assert!(matches!(
                decode_frame(&buf[..cut], 1, 0).unwrap(),
                Frame::Bad { extent: None }
            ));
        }
        for cut in [FRAME_HEADER, n - 1] {
            assert!(matches!(
                decode_frame(&buf[..cut], 1, 0).unwrap(),
                Frame::Bad { extent: Some(e) } if e == n
            ));
        }
        let mut flipped = buf.clone();
        flipped[n - 3] ^= 0x40;
        assert!(matches!(
            decode_frame(&flipped, 1, 0).unwrap(),
            Frame::Bad { extent: Some(_) }
        ));
    }

    #[test]
    fn the_header_is_checksummed_and_bound_to_its_position() {
        let (mut buf, _) = sample_frame(7);
        place_frame(&mut buf, 3, 4096);
        assert!(matches!(
            decode_frame(&buf, 3, 4096).unwrap(),
            Frame::Ok(..)
        ));
        // The same bytes anywhere else are not a frame.
        for (seq, off) in [(3, 0), (4, 4096), (2, 4096)] {
            assert!(matches!(
                decode_frame(&buf, seq, off).unwrap(),
                Frame::Bad { extent: None }
            ));
        }
        // A flipped bit in the magic or the length is caught by the header checksum.
        for byte in [0, 1, 4, 5, 6] {
            let mut b = buf.clone();
            b[byte] ^= 0x01;
            assert!(
                matches!(
                    decode_frame(&b, 3, 4096).unwrap(),
                    Frame::Bad { extent: None }
                ),
                "byte {byte}"
            );
        }
        let mut hay = vec![0u8; 100];
        hay.extend_from_slice(&buf);
        assert_eq!(find_frame_header(&hay, 3, 0), None, "bound to offset 4096");
        let mut b2 = buf.clone();
        place_frame(&mut b2, 3, 100);
        let mut hay = vec![0u8; 100];
        hay.extend_from_slice(&b2);
        assert_eq!(find_frame_header(&hay, 3, 0), Some(100));
    }
}
