//! The reclaim thread: frees what evictions took out of the map.

use crossbeam_channel::Receiver;

use super::shared::Slot;

/// States an eviction took out of the map, to be freed.
pub type Evicted = Vec<(Box<[u8]>, Slot)>;

/// Evictions waiting for the [`Reclaimer`] at most; past that the
/// checkpointer frees them itself, so memory stays bounded whatever the
/// reclaim thread gets of the CPU.
pub const RECLAIM_BACKLOG: usize = 2;

/// The reclaim thread: frees what evictions took out of the map. Nothing
/// waits for it; it moves the cost of freeing ~95,000 cold records per
/// segment off the checkpointer, which the writer waits for when it falls
/// behind. Measured at 1,024 in flight: 6 % less CPU per pair (the frees no
/// longer run on the thread holding the segment's keys in its cache).
pub struct Reclaimer {
    pub rx: Receiver<Evicted>,
}

impl Reclaimer {
    /// The reclaim thread's loop; ends when the checkpointer is gone.
    // Never inlined: `bench/instructions` counts each thread's
    // instructions under this function's name.
    #[inline(never)]
    pub fn run(self) {
        for evicted in self.rx {
            drop(evicted);
        }
    }
}
