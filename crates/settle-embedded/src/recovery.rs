//! Recovery: the index as of its last checkpoint, then every whole frame of
//! the log after it.
//!
//! Recovery first reads and judges everything without changing anything;
//! only a store it accepts gets its log tidied ([`Recovered::apply`]). A
//! refused store is left exactly as found, for the operator (and `settle
//! check`, which never applies anything).
//!
//! What a crash can leave, and so what is accepted (docs/design.md):
//! * segments numbered consecutively after the checkpoint's; frames in them
//!   numbered consecutively after the checkpoint's batch;
//! * in the last segment only, one torn write after the last whole frame:
//!   non-zero bytes only within that frame's extent (known from its header
//!   if the header survived, else up to the end of the segment), and no
//!   intact frame after it. Anything else is damage to acknowledged data.
//!
//! Recovery rewrites the last whole frame in place (see [`Plan`]). A power
//! cut during that rewrite may tear sectors that held an acknowledged
//! frame, so the frame is first copied to a side file ([`COPY`], a
//! double write): a valid copy found by the next recovery is laid over its
//! segment before anything is judged.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dashmap::DashMap;
use settle_ledger::StoreError;

use crate::codec::{
    EntityKey, FRAME_MAGIC_V1, Frames, Value, decode_frames, decode_value, find_frame_header,
};
use crate::engine::{Hasher, Slot};
use crate::fs::Fs;
use crate::index::{Index, Meta};
use crate::wal::{self, first_nonzero, last_nonzero};

type Map = DashMap<Box<[u8]>, Slot, Hasher>;

/// The copy of the last frame, synced before the frame is rewritten in place.
pub const COPY: &str = "last-frame.copy";
/// A copy being written; renamed to [`COPY`] once durable.
const COPY_TMP: &str = "last-frame.copy.tmp";
const COPY_MAGIC: &[u8; 4] = b"STLC";
/// magic + segment + offset + length, then the bytes, then a crc32 of all.
const COPY_HEADER: usize = 4 + 8 + 8 + 8;

/// Bytes of a segment as they were when a rewrite began.
#[derive(Debug, PartialEq, Eq)]
struct Copy {
    seq: u64,
    at: u64,
    bytes: Vec<u8>,
}

impl Copy {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(COPY_HEADER + self.bytes.len() + 4);
        out.extend_from_slice(COPY_MAGIC);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.at.to_le_bytes());
        out.extend_from_slice(&(self.bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.bytes);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// `None` for anything but a whole, intact copy: a copy torn while it
    /// was written was never relied on (the rewrite starts after it is durable).
    fn decode(b: &[u8]) -> Option<Copy> {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if b.len() < COPY_HEADER + 4 || &b[..4] != COPY_MAGIC {
            return None;
        }
        let len = usize::try_from(u64_at(20)).ok()?;
        if b.len() != COPY_HEADER.checked_add(len)?.checked_add(4)? {
            return None;
        }
        let (body, crc) = b.split_at(b.len() - 4);
        if crc32fast::hash(body).to_le_bytes() != crc {
            return None;
        }
        Some(Copy {
            seq: u64_at(4),
            at: u64_at(12),
            bytes: body[COPY_HEADER..].to_vec(),
        })
    }

    /// Lays the copy over its segment's bytes.
    fn restore(&self, buf: &mut [u8], path: &Path) -> Result<(), StoreError> {
        let range = usize::try_from(self.at)
            .ok()
            .and_then(|at| Some(at..at.checked_add(self.bytes.len())?))
            .filter(|r| r.end <= buf.len())
            .ok_or_else(|| {
                corrupt(format!(
                    "{COPY} holds {} bytes at {} of {}, which is only {} bytes long",
                    self.bytes.len(),
                    self.at,
                    path.display(),
                    buf.len()
                ))
            })?;
        if buf[range.clone()] != self.bytes[..] {
            tracing::warn!(segment = %path.display(), at = self.at, "restoring the last frame from its copy (a rewrite was cut short)");
        }
        buf[range].copy_from_slice(&self.bytes);
        Ok(())
    }
}

/// The copy left by a rewrite that did not finish, if it is intact.
fn read_copy<F: Fs>(fs: &F, wal_dir: &Path, plan: &mut Plan) -> Result<Option<Copy>, StoreError> {
    let names = fs
        .list(wal_dir)
        .map_err(|e| StoreError::Io(format!("{}: {e}", wal_dir.display())))?;
    if names.iter().any(|n| n == COPY_TMP) {
        plan.prepared.push(wal_dir.join(COPY_TMP));
    }
    if !names.iter().any(|n| n == COPY) {
        return Ok(None);
    }
    let path = wal_dir.join(COPY);
    let bytes = fs
        .read(&path)
        .map_err(|e| StoreError::Io(format!("reading {}: {e}", path.display())))?;
    // Removed once the new rewrite is durable, never before.
    plan.copy = Some(path);
    Ok(Copy::decode(&bytes))
}

/// The state recovered from the index and the log.
pub struct Recovered {
    /// Every open record, plus every entity the log changed after the checkpoint.
    pub map: Map,
    /// The index's checkpoint.
    pub meta: Meta,
    /// The last batch on record.
    pub lsn: u64,
    pub next_fence: u64,
    /// Records marked disputed, store-wide.
    pub disputed: u64,
    /// The highest segment number seen.
    pub last_seq: u64,
    /// The last segment after the checkpoint and where its whole frames end.
    pub resume: Option<(u64, u64)>,
    /// Keys whose stored value does not decode.
    pub undecodable: Vec<Box<[u8]>>,
    /// A torn tail that was cut (segment, from, to), for the log.
    pub torn: Option<(PathBuf, u64, u64)>,
    plan: Plan,
}

/// What an accepted store needs tidied before it is written to.
#[derive(Default)]
struct Plan {
    /// Segments the checkpoint covers whose deletion did not complete.
    covered: Vec<PathBuf>,
    /// Leftover `.prep` files.
    prepared: Vec<PathBuf>,
    /// The last whole frame: rewritten and synced, because after a failed
    /// fsync in this boot the page cache may show bytes the disk lacks.
    rewrite: Option<(PathBuf, Copy)>,
    /// The copy of an earlier rewrite, to remove once this one is durable.
    copy: Option<PathBuf>,
}

fn corrupt(msg: String) -> StoreError {
    StoreError::Corrupt(msg)
}

fn decode_slot(key: &[u8], bytes: &[u8], lsn: u64, undecodable: &mut Vec<Box<[u8]>>) -> Slot {
    let value = match decode_value(bytes) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(key = %String::from_utf8_lossy(key), error = %e, "stored value does not decode; its key is refused");
            undecodable.push(key.into());
            Value::Undecodable(e.to_string().into())
        }
    };
    Slot {
        lsn,
        value: Arc::new(value),
    }
}

/// Judges the tail of a segment after its whole frames. `Ok(Some(range))`
/// is a torn tail to cut; an error is damage no crash explains.
fn check_tail(
    buf: &[u8],
    seq: u64,
    f: &Frames<'_>,
    is_last: bool,
    path: &Path,
) -> Result<Option<(u64, u64)>, StoreError> {
    let v = f.valid;
    let Some(first) = first_nonzero(buf, v) else {
        return Ok(None);
    };
    if buf.len() >= v + 4 && buf[v..v + 4] == FRAME_MAGIC_V1.to_le_bytes() {
        return Err(corrupt(format!(
            "{} holds a log frame of format 1 at byte {v}, written by an older settle: \
             open the store with that version and close it cleanly (which checkpoints the log), then upgrade",
            path.display()
        )));
    }
    if !is_last {
        return Err(corrupt(format!(
            "log segment {} is damaged at byte {v} (non-zero byte at {first}) and later segments exist: \
             this is not a torn write; the store is left untouched",
            path.display()
        )));
    }
    // The write in progress at the crash started at `v`. Its extent is
    // known if its header survived; otherwise it may reach the segment's end.
    let window_end = match f.bad_extent {
        Some(ext) => (v + ext).min(buf.len()),
        None => buf.len(),
    };
    if let Some(x) = first_nonzero(buf, window_end) {
        return Err(corrupt(format!(
            "log segment {} is damaged at byte {v}: non-zero byte at {x}, after the end ({window_end}) \
             of the one write a crash could have torn; the store is left untouched",
            path.display()
        )));
    }
    if let Some(x) = find_frame_header(buf, seq, v + 1) {
        return Err(corrupt(format!(
            "log segment {} is damaged at byte {v}: a frame at byte {x} follows it, \
             so acknowledged data is damaged; the store is left untouched",
            path.display()
        )));
    }
    let end = last_nonzero(buf).map_or(v, |l| l + 1);
    Ok(Some((v as u64, end as u64)))
}

/// Reads the index and the log after its checkpoint into memory, changing
/// nothing: the open records of the index, then the segments after the
/// checkpoint, judged and replayed in order.
pub fn recover<F: Fs, I: Index>(
    fs: &F,
    wal_dir: &Path,
    index: &I,
) -> Result<Recovered, StoreError> {
    let meta = index.meta()?;
    let mut undecodable = Vec::new();
    let map = load_open_records(index, &meta, &mut undecodable)?;
    let Segments {
        mut plan,
        live,
        last_seq,
    } = list_segments(fs, wal_dir, &meta)?;
    let copy = read_copy(fs, wal_dir, &mut plan)?;
    let replayed = replay(
        fs,
        &live,
        &meta,
        &map,
        copy.as_ref(),
        &mut undecodable,
        &mut plan,
    )?;
    check_fences(&map, replayed.next_fence)?;
    let disputed = match (replayed.disputed, meta.disputed) {
        (Some(d), _) | (None, Some(d)) => d,
        // An index from before the count: count once (then kept in every frame).
        (None, None) => count_disputed(index)?,
    };
    Ok(Recovered {
        map,
        meta,
        lsn: replayed.lsn,
        next_fence: replayed.next_fence,
        disputed,
        last_seq,
        resume: replayed.resume,
        undecodable,
        torn: replayed.torn,
        plan,
    })
}

/// Every record the index lists as open, into the map.
fn load_open_records<I: Index>(
    index: &I,
    meta: &Meta,
    undecodable: &mut Vec<Box<[u8]>>,
) -> Result<Map, StoreError> {
    let map: Map = DashMap::default();
    for (k, bytes) in index.open_records()? {
        let slot = decode_slot(&k, bytes.as_ref(), meta.checkpoint_lsn, undecodable);
        let keep = match &*slot.value {
            // A stale id: the record settled or went since.
            Value::Record(r) => !r.status.is_terminal(),
            Value::Undecodable(_) => true,
            _ => false,
        };
        if keep {
            map.insert(k.into_boxed_slice(), slot);
        }
    }
    Ok(map)
}

/// The log's segments as recovery sorts them.
struct Segments {
    /// The covered segments and leftover preparations, to tidy.
    plan: Plan,
    /// The segments after the checkpoint, in order.
    live: Vec<(u64, PathBuf)>,
    /// The highest segment number seen.
    last_seq: u64,
}

/// Sorts the segments: those after the checkpoint must be numbered
/// consecutively from it.
fn list_segments<F: Fs>(fs: &F, wal_dir: &Path, meta: &Meta) -> Result<Segments, StoreError> {
    let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", wal_dir.display()));
    let mut plan = Plan {
        prepared: wal::prepared(fs, wal_dir).map_err(io)?,
        ..Plan::default()
    };
    let segments = wal::segments(fs, wal_dir).map_err(io)?;
    let mut last_seq = meta.checkpoint_seq;
    let mut live = Vec::new();
    for (seq, path) in segments {
        last_seq = last_seq.max(seq);
        if seq <= meta.checkpoint_seq {
            plan.covered.push(path);
        } else {
            live.push((seq, path));
        }
    }
    for (i, (seq, path)) in live.iter().enumerate() {
        let expected = meta.checkpoint_seq + 1 + i as u64;
        if *seq != expected {
            return Err(corrupt(format!(
                "log segment {expected} is missing before {} (the index checkpoint covers segments up to {})",
                path.display(),
                meta.checkpoint_seq
            )));
        }
    }
    Ok(Segments {
        plan,
        live,
        last_seq,
    })
}

/// What replaying the log found.
struct Replayed {
    lsn: u64,
    next_fence: u64,
    /// The last frame's disputed count, if any frame was replayed.
    disputed: Option<u64>,
    resume: Option<(u64, u64)>,
    torn: Option<(PathBuf, u64, u64)>,
}

/// Replays every whole frame of the live segments into the map, in order,
/// judging each segment's tail (after laying `copy` over its segment);
/// notes the last frame for rewriting.
fn replay<F: Fs>(
    fs: &F,
    live: &[(u64, PathBuf)],
    meta: &Meta,
    map: &Map,
    copy: Option<&Copy>,
    undecodable: &mut Vec<Box<[u8]>>,
    plan: &mut Plan,
) -> Result<Replayed, StoreError> {
    let mut r = Replayed {
        lsn: meta.checkpoint_lsn,
        next_fence: meta.next_fence,
        disputed: None,
        resume: None,
        torn: None,
    };
    for (i, (seq, path)) in live.iter().enumerate() {
        let mut buf = wal::read_segment(fs, path)?;
        if let Some(c) = copy.filter(|c| c.seq == *seq) {
            c.restore(&mut buf, path)?;
        }
        let frames =
            decode_frames(&buf, *seq).map_err(|e| corrupt(format!("{}: {e}", path.display())))?;
        let is_last = i + 1 == live.len();
        if let Some((from, to)) = check_tail(&buf, *seq, &frames, is_last, path)? {
            r.torn = Some((path.clone(), from, to));
        }
        for (b, start) in frames.batches.iter().zip(&frames.starts) {
            if b.lsn != r.lsn + 1 {
                return Err(corrupt(format!(
                    "{}: batch {} at byte {start} where batch {} was expected",
                    path.display(),
                    b.lsn,
                    r.lsn + 1
                )));
            }
            r.lsn = b.lsn;
            r.next_fence = r.next_fence.max(b.next_fence);
            r.disputed = Some(b.disputed);
            for e in &b.entries {
                let value = if e.value.is_empty() {
                    Slot {
                        lsn: r.lsn,
                        value: Arc::new(Value::Gone),
                    }
                } else {
                    decode_slot(e.key, e.value, r.lsn, undecodable)
                };
                map.insert(e.key.into(), value);
            }
        }
        if let Some(start) = frames.starts.last() {
            plan.rewrite = Some((
                path.clone(),
                Copy {
                    seq: *seq,
                    at: *start as u64,
                    bytes: buf[*start..frames.valid].to_vec(),
                },
            ));
        }
        if is_last {
            r.resume = Some((*seq, frames.valid as u64));
        }
    }
    Ok(r)
}

/// Fences are never reused: the counter must be past every fence on record.
fn check_fences(map: &Map, next_fence: u64) -> Result<(), StoreError> {
    for s in map.iter() {
        if let Value::Record(r) = &*s.value
            && let Some(f) = r.last_fence()
            && f.0 >= next_fence
        {
            return Err(corrupt(format!(
                "fence {} on record but the counter is at {next_fence}",
                f.0
            )));
        }
    }
    Ok(())
}

/// Records marked disputed in the whole index (one scan).
fn count_disputed<I: Index>(index: &I) -> Result<u64, StoreError> {
    let mut n = 0u64;
    index.for_each(&mut |_, v| {
        if let Ok(Value::Record(r)) = decode_value(v)
            && r.disputed
        {
            n += 1;
        }
    })?;
    Ok(n)
}

impl Recovered {
    /// Tidies the log of an accepted store: the checkpoint's `meta` is
    /// written afresh before the segments it covers are deleted, leftover
    /// preparations go, a torn tail is zeroed, the last frame is rewritten,
    /// each durably. Then the directory is synced.
    pub fn apply<F: Fs, I: Index>(
        &mut self,
        fs: &F,
        wal_dir: &Path,
        index: &I,
    ) -> Result<(), StoreError> {
        let io = |what: &str, p: &Path, e: std::io::Error| {
            StoreError::Io(format!("{what} {}: {e}", p.display()))
        };
        let plan = std::mem::take(&mut self.plan);
        if !plan.covered.is_empty() {
            // After a failed persist in this boot the page cache may show a
            // `meta` the disk lacks; write it again before relying on it.
            index.commit_meta(&self.meta)?;
            for p in &plan.covered {
                fs.remove(p).map_err(|e| io("removing", p, e))?;
            }
        }
        for p in &plan.prepared {
            fs.remove(p).map_err(|e| io("removing", p, e))?;
        }
        if let Some((path, from, to)) = &self.torn {
            // Never acknowledged: zeroed so that later appends follow whole
            // frames and a later recovery does not mistake it for damage.
            tracing::warn!(segment = %path.display(), from, to, "zeroing a torn log tail");
            let f = fs.open(path).map_err(|e| io("opening", path, e))?;
            crate::fs::FsFile::write_at(&f, &vec![0u8; (to - from) as usize], *from)
                .and_then(|_| crate::fs::FsFile::sync_data(&f))
                .map_err(|e| io("zeroing the torn tail of", path, e))?;
        }
        if let Some((path, copy)) = &plan.rewrite {
            // The double write: a durable copy first (renamed into place, so
            // an earlier intact copy is replaced, never truncated), then the
            // frame in place. A cut during the in-place write leaves the copy
            // for the next recovery to restore.
            let tmp = wal_dir.join(COPY_TMP);
            let f = fs.create(&tmp).map_err(|e| io("creating", &tmp, e))?;
            crate::fs::FsFile::write_at(&f, &copy.encode(), 0)
                .and_then(|_| crate::fs::FsFile::sync_data(&f))
                .map_err(|e| io("writing", &tmp, e))?;
            let dst = wal_dir.join(COPY);
            fs.rename(&tmp, &dst)
                .and_then(|_| fs.sync_dir(wal_dir))
                .map_err(|e| io("renaming", &tmp, e))?;
            let f = fs.open(path).map_err(|e| io("opening", path, e))?;
            crate::fs::FsFile::write_at(&f, &copy.bytes, copy.at)
                .and_then(|_| crate::fs::FsFile::sync_data(&f))
                .map_err(|e| io("rewriting the last frame of", path, e))?;
            fs.remove(&dst).map_err(|e| io("removing", &dst, e))?;
        } else if let Some(p) = &plan.copy {
            // A copy of a segment that is gone or empty now: nothing to restore.
            fs.remove(p).map_err(|e| io("removing", p, e))?;
        }
        // Every removal above, and the copy's, is durable before anything
        // new is written.
        fs.sync_dir(wal_dir)
            .map_err(|e| io("syncing", wal_dir, e))?;
        Ok(())
    }

    /// The entity keys that did not decode, for reports.
    pub fn describe(key: &[u8]) -> String {
        match EntityKey::from_bytes(key) {
            Ok(EntityKey::Record(t, k)) => format!("{t}/{k}"),
            Ok(EntityKey::Principal(t, p)) => format!("{t} principal {p}"),
            Ok(EntityKey::Task(t, task)) => format!("{t} task {task}"),
            Err(_) => String::from_utf8_lossy(key).into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Batch, Entry, FRAME_VERSION, encode_for_log, encode_frame, place_frame};
    use crate::fs::{FsFile, OsFs};
    use crate::index::FjallIndex;
    use settle_core::TenantId;

    /// A data directory on the real filesystem with a fresh index: the
    /// tests write (and sync) the log segments themselves, and recovery
    /// judges what they wrote.
    struct Data {
        dir: tempfile::TempDir,
        index: FjallIndex,
    }

    impl Data {
        fn wal(&self) -> PathBuf {
            self.dir.path().join("wal")
        }
    }

    /// A segment file of frames with the given batch numbers, preallocated.
    fn segment(d: &Data, seq: u64, lsns: &[u64]) -> Vec<usize> {
        let k = EntityKey::Record(
            TenantId::default_tenant(),
            settle_core::Key::new("k").unwrap(),
        )
        .to_bytes();
        let mut buf = Vec::new();
        let mut starts = Vec::new();
        for &lsn in lsns {
            let start = buf.len();
            starts.push(start);
            let v = Value::Gone;
            let blob = encode_for_log(&v);
            encode_frame(
                &Batch {
                    version: FRAME_VERSION,
                    lsn,
                    next_fence: 1,
                    disputed: 0,
                    entries: vec![Entry::new(&k, &v, &blob)],
                },
                &mut buf,
            );
            place_frame(&mut buf[start..], seq, start as u64);
        }
        buf.resize(8192, 0);
        let f = OsFs.create(&wal::segment_path(&d.wal(), seq)).unwrap();
        f.write_at(&buf, 0).unwrap();
        f.sync_all().unwrap();
        starts
    }

    fn data() -> Data {
        let dir = tempfile::tempdir().unwrap();
        OsFs.create_dir(&dir.path().join("wal")).unwrap();
        let index = FjallIndex::open(&dir.path().join("index")).unwrap();
        Data { dir, index }
    }

    fn recover_on(d: &Data) -> Result<Recovered, StoreError> {
        recover(&OsFs, &d.wal(), &d.index)
    }

    fn refused(d: &Data, what: &str) -> String {
        match recover_on(d) {
            Err(StoreError::Corrupt(m)) => m,
            Err(e) => panic!("{what}: {e}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }

    #[test]
    fn consecutive_batches_and_segments_are_accepted() {
        let d = data();
        segment(&d, 1, &[1, 2, 3]);
        segment(&d, 2, &[4, 5]);
        let r = recover_on(&d).unwrap();
        assert_eq!((r.lsn, r.resume), (5, Some((2, r.resume.unwrap().1))));
        assert!(r.torn.is_none());
    }

    #[test]
    fn a_gap_in_batch_numbers_is_refused() {
        let d = data();
        segment(&d, 1, &[1, 2, 4]);
        let m = refused(&d, "gap in a segment");
        assert!(
            m.contains("batch 4") && m.contains("batch 3 was expected"),
            "{m}"
        );

        let d = data();
        segment(&d, 1, &[1, 2]);
        segment(&d, 2, &[4]);
        let m = refused(&d, "gap across segments");
        assert!(m.contains("00000000000000000002.log"), "{m}");

        // The first batch must follow the checkpoint's.
        let d = data();
        segment(&d, 1, &[2, 3]);
        refused(&d, "first batch after the checkpoint");
    }

    #[test]
    fn a_missing_segment_is_refused() {
        let d = data();
        segment(&d, 1, &[1]);
        segment(&d, 3, &[2]);
        let m = refused(&d, "missing segment");
        assert!(m.contains("log segment 2 is missing"), "{m}");
        let d = data();
        segment(&d, 2, &[1]);
        refused(&d, "first segment missing");
    }

    #[test]
    fn a_frame_after_zeros_is_damage_not_a_torn_tail() {
        // Frame 2 lost entirely (zeros), frame 3 intact after it.
        let d = data();
        let starts = segment(&d, 1, &[1, 2, 3]);
        let path = wal::segment_path(&d.wal(), 1);
        let f = OsFs.open(&path).unwrap();
        f.write_at(&vec![0u8; starts[2] - starts[1]], starts[1] as u64)
            .unwrap();
        f.sync_data().unwrap();
        let m = refused(&d, "zeroed frame");
        assert!(
            m.contains(&format!("damaged at byte {}", starts[1]))
                && m.contains(&format!("a frame at byte {}", starts[2])),
            "{m}"
        );
    }

    #[test]
    fn a_format_1_frame_is_refused_not_cut() {
        let d = data();
        let path = wal::segment_path(&d.wal(), 1);
        let f = OsFs.create(&path).unwrap();
        let mut buf = FRAME_MAGIC_V1.to_le_bytes().to_vec();
        buf.extend_from_slice(&[9, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        buf.resize(8192, 0);
        f.write_at(&buf, 0).unwrap();
        f.sync_all().unwrap();
        let m = refused(&d, "format 1");
        assert!(m.contains("format 1"), "{m}");
    }

    #[test]
    fn a_torn_tail_is_judged_by_its_header() {
        // The last frame torn after its (intact) header: its extent is known.
        let d = data();
        let starts = segment(&d, 1, &[1, 2, 3]);
        let path = wal::segment_path(&d.wal(), 1);
        let all = OsFs.read(&path).unwrap();
        let end = crate::wal::last_nonzero(&all).unwrap() + 1;
        let f = OsFs.open(&path).unwrap();
        // Lose the end of frame 3 (a torn write).
        f.write_at(&vec![0u8; end - starts[2] - 20], starts[2] as u64 + 20)
            .unwrap();
        f.sync_data().unwrap();
        let r = recover_on(&d).unwrap();
        assert_eq!(r.lsn, 2);
        assert_eq!(r.torn.as_ref().map(|t| t.1), Some(starts[2] as u64));
        // A byte beyond that frame's extent is not explained by tearing it.
        f.write_at(&[7], end as u64 + 100).unwrap();
        f.sync_data().unwrap();
        let m = refused(&d, "byte beyond the torn frame");
        assert!(
            m.contains(&format!("non-zero byte at {}", end + 100)),
            "{m}"
        );
    }

    #[test]
    fn a_copy_decodes_only_whole_and_intact() {
        let c = Copy {
            seq: 3,
            at: 4096,
            bytes: (0..200u8).collect(),
        };
        let b = c.encode();
        assert_eq!(Copy::decode(&b), Some(c));
        // Torn while written: any prefix, any flipped bit.
        for n in 0..b.len() {
            assert_eq!(Copy::decode(&b[..n]), None, "prefix {n}");
        }
        for i in 0..b.len() {
            let mut x = b.clone();
            x[i] ^= 0x10;
            assert_eq!(Copy::decode(&x), None, "bit flipped in byte {i}");
        }
    }

    /// A rewrite cut short: the last frame is garbage in place, its copy is
    /// intact. Recovery restores it (and `check`, which only reads, sees it);
    /// without the copy the frame would be cut as a torn tail.
    #[test]
    fn an_intact_copy_restores_a_frame_torn_in_place() {
        let d = data();
        let starts = segment(&d, 1, &[1, 2, 3]);
        let path = wal::segment_path(&d.wal(), 1);
        let all = OsFs.read(&path).unwrap();
        let end = crate::wal::last_nonzero(&all).unwrap() + 1;
        let copy = Copy {
            seq: 1,
            at: starts[2] as u64,
            bytes: all[starts[2]..end].to_vec(),
        };
        let f = OsFs.open(&path).unwrap();
        f.write_at(&vec![0xa5; end - starts[2]], starts[2] as u64)
            .unwrap();
        f.sync_data().unwrap();
        assert_eq!(recover_on(&d).unwrap().lsn, 2, "torn without its copy");

        let c = OsFs.create(&d.wal().join(COPY)).unwrap();
        c.write_at(&copy.encode(), 0).unwrap();
        c.sync_data().unwrap();
        let mut r = recover_on(&d).unwrap();
        assert_eq!(r.lsn, 3);
        assert!(r.torn.is_none());
        r.apply(&OsFs, &d.wal(), &d.index).unwrap();
        assert_eq!(OsFs.read(&path).unwrap(), all, "restored in place");
        assert!(OsFs.read(&d.wal().join(COPY)).is_err(), "copy removed");

        // A copy torn while it was written is ignored (the rewrite had not
        // begun) and removed.
        let c = OsFs.create(&d.wal().join(COPY)).unwrap();
        c.write_at(&copy.encode()[..30], 0).unwrap();
        c.sync_data().unwrap();
        let mut r = recover_on(&d).unwrap();
        assert_eq!(r.lsn, 3);
        r.apply(&OsFs, &d.wal(), &d.index).unwrap();
        assert!(OsFs.read(&d.wal().join(COPY)).is_err(), "copy removed");
    }
}
