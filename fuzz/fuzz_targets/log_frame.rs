//! The embedded engine's log frame decoder (settle-embedded `codec`): what
//! recovery reads back from a segment file.
//!
//! Input: a mode byte, then either a whole segment's bytes (even mode) or
//! one frame's payload (odd mode), which the target seals with a correct
//! header and checksums so that the decoder behind them is reached.
//!
//! Properties: decoding never panics; the whole frames found are
//! contiguous from byte 0 and end where the decoder says; each re-encodes,
//! at its place, into a frame no longer than the original that decodes to
//! the same batch, byte for byte the original when it was canonical; the
//! torn-tail report agrees with the header check; every entry's key and
//! value obey their own round trips (`settle_fuzz::check_value`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use settle_embedded::codec::{self, Batch, EntityKey, Entry, FRAME_HEADER, Frame};

/// The segment the bytes are read as (the header checksum binds it).
const SEQ: u64 = 7;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        check_segment(rest);
    } else {
        check_segment(&sealed(rest));
    }
});

/// `payload` as the one frame at byte 0 of segment [`SEQ`].
fn sealed(payload: &[u8]) -> Vec<u8> {
    // The magic comes from a real frame (the constant is private).
    let mut frame = Vec::new();
    codec::encode_frame(&empty_batch(), &mut frame);
    frame.truncate(4);
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(payload);
    codec::place_frame(&mut frame, SEQ, 0);
    frame
}

fn empty_batch() -> Batch<'static> {
    Batch {
        version: codec::FRAME_VERSION,
        lsn: 0,
        next_fence: 0,
        disputed: 0,
        entries: Vec::new(),
    }
}

fn check_segment(buf: &[u8]) {
    // Damage behind intact checksums is an error, reported (not a panic).
    let Ok(frames) = codec::decode_frames(buf, SEQ) else {
        return;
    };
    assert_eq!(frames.batches.len(), frames.starts.len());
    let mut end = 0;
    for (batch, &start) in frames.batches.iter().zip(&frames.starts) {
        assert_eq!(start, end, "frames are contiguous");
        let extent = codec::frame_extent(&buf[start..], SEQ, start as u64)
            .expect("a whole frame has an intact header");
        assert!(extent >= FRAME_HEADER);
        end = start + extent;
        check_reencoding(batch, &buf[start..end], start as u64);
        for e in &batch.entries {
            check_entry(e);
        }
    }
    assert_eq!(
        end, frames.valid,
        "the valid prefix ends after the last frame"
    );
    assert!(frames.valid <= buf.len());
    let tail = &buf[frames.valid..];
    assert_eq!(
        frames.bad_extent,
        codec::frame_extent(tail, SEQ, frames.valid as u64),
        "the torn tail's extent is its header's"
    );
    if let Some(i) = codec::find_frame_header(buf, SEQ, 0) {
        assert!(codec::frame_extent(&buf[i..], SEQ, i as u64).is_some());
        if !frames.batches.is_empty() {
            assert_eq!(i, 0, "the first intact header is the first frame's");
        }
    } else {
        assert!(frames.batches.is_empty() && frames.bad_extent.is_none());
    }
}

fn check_reencoding(batch: &Batch<'_>, original: &[u8], offset: u64) {
    let mut out = Vec::new();
    codec::encode_frame(batch, &mut out);
    codec::place_frame(&mut out, SEQ, offset);
    assert!(out.len() <= original.len(), "re-encoding grew the frame");
    if out.len() == original.len() {
        assert_eq!(out, original, "a canonical frame re-encodes to itself");
    }
    match codec::decode_frame(&out, SEQ, offset) {
        Ok(Frame::Ok(back, n)) => {
            assert_eq!(&back, batch, "a batch survives its own encoding");
            assert_eq!(n, out.len());
        }
        Ok(Frame::Bad { extent }) => panic!("a re-encoded frame reads as torn ({extent:?})"),
        Err(e) => panic!("a re-encoded frame does not decode: {e}"),
    }
}

fn check_entry(e: &Entry<'_>) {
    if let Ok(k) = EntityKey::from_bytes(e.key) {
        assert_eq!(k.to_bytes(), e.key, "an entity key re-encodes to itself");
    }
    if e.value.is_empty() {
        return; // Gone
    }
    if let Ok(v) = codec::decode_value(e.value) {
        settle_fuzz::check_value(&v, e.value);
    }
}
