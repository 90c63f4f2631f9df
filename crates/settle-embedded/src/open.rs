//! Opening a data directory, for both stores: recovery, then the
//! writer's and the checkpointer's state.

use std::path::Path;
use std::sync::Arc;

use settle_ledger::StoreError;

use crate::fs::Fs;
use crate::index::Index;
use crate::options::EmbeddedOptions;
use crate::pace::Pacer;
use crate::{Checkpointer, CkptMsg, Core, SealSink, Shared, recovery, wal};

pub(crate) fn io(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}

/// The writer's and the checkpointer's state.
pub(crate) type Engine<F, I> = (Core<F, I>, Checkpointer<F, I>);

/// Recovers the store in `dir` (on `fs`, with `index`), tidies its log and
/// builds the writer's and the checkpointer's state.
pub(crate) fn recover_engine<F: Fs, I: Index>(
    fs: &F,
    dir: &Path,
    index: I,
    opts: &EmbeddedOptions,
    mut sealed: SealSink,
) -> Result<Engine<F, I>, StoreError> {
    let wal_dir = dir.join("wal");
    let mut rec = recovery::recover(fs, &wal_dir, &index)?;
    rec.apply(fs, &wal_dir, &index)?;
    let size = opts.segment_bytes.max(4096);
    let pacer = Arc::new(Pacer::default());
    let wal = match rec.resume {
        // Keep filling the last segment's preallocated space.
        Some((seq, valid)) if valid + 4096 <= size => {
            wal::Wal::resume(fs, &wal_dir, seq, size, valid, opts.faults(), pacer.clone())
        }
        _ => wal::Wal::create(
            fs,
            &wal_dir,
            rec.last_seq + 1,
            size,
            opts.faults(),
            pacer.clone(),
        ),
    }
    .map_err(io)?;
    // Segments before the one being written are sealed: a backlog left by a
    // crash (or by halted checkpoints) is checkpointed now, not only when
    // the next segment fills, so it never lingers across reopens.
    let sealed_upto = wal.seq() - 1;
    if sealed_upto > rec.meta.checkpoint_seq {
        match &mut sealed {
            SealSink::Channel(tx) => {
                // The channel is new, empty and holds at least one message.
                let _ = tx.try_send(CkptMsg::Sealed(sealed_upto));
            }
            SealSink::Queue(q) => q.push(sealed_upto),
        }
    }
    let map = std::mem::take(&mut rec.map);
    let listed = map
        .iter()
        .filter(|s| s.key().first() == Some(&b'r'))
        .map(|s| s.key().clone())
        .collect();
    let shared = Arc::new(Shared::new(index, map, opts.clock.clone(), opts.limits));
    #[cfg(feature = "faults")]
    shared.set_faults(opts.faults());
    for k in &rec.undecodable {
        shared.note_undecodable(k.clone());
    }
    let ckpt = Checkpointer {
        shared: shared.clone(),
        fs: fs.clone(),
        wal_dir,
        meta: rec.meta,
        faults: opts.faults(),
        listed,
        read_buf: Vec::new(),
        pacer,
        reclaim: None,
    };
    let core = Core::new(shared, wal, &rec, opts.max_batch, sealed, opts.faults());
    Ok((core, ckpt))
}
