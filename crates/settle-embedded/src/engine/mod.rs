//! The embedded engine: a single writer with group commit, the log
//! thread, and the checkpointer.
//!
//! # Commit protocol (see docs/design.md)
//!
//! 1. The writer applies each command as it comes (up to `max_batch` a
//!    batch) through `settle_core::apply` in arrival order against the
//!    latest state (batch overlay, then the batches staged before it and
//!    not yet published, then the durable map, then the index):
//!    [`stage`].
//! 2. When fewer than [`IN_FLIGHT`] frames are at the log thread, it
//!    encodes the final state of every entity the batch changed into one
//!    frame and hands it over; the log thread `write`s and `fdatasync`s
//!    frames in order (one frame at most written and not yet durable)
//!    while the writer gathers the next batch: [`writer`], [`log_thread`],
//!    [`log`].
//! 3. Only then does the writer publish the new states to the map (which
//!    readers see) and answer every caller; the next frame is on its way
//!    to the disk meanwhile.
//! 4. When a segment is full the log thread seals it; the checkpointer
//!    writes every entity changed in it into the index, makes that
//!    durable, deletes the segment and evicts terminal records from
//!    memory: [`checkpoint`].
//!
//! # Threads and who owns what
//!
//! | thread (OS name) | owns | module |
//! |---|---|---|
//! | writer (`settle-writer`) | [`stage::Stage`]: the next fence, the staged batches, the principal cache; publishes to the map | [`writer`], [`stage`] |
//! | log thread (`settle-log`) | [`log::Log`]: the open segment; seals segments | [`log_thread`], [`log`] |
//! | checkpointer (`settle-checkpoint`) | the index's ingestion; the only evictor | [`checkpoint`] |
//! | reclaim (`settle-reclaim`) | frees evicted states | [`reclaim`] |
//!
//! Inline ([`crate::InlineStore`]), [`Core`] runs stage and log one after
//! the other on the caller's thread and the caller runs the checkpointer.
//!
//! **Who may evict a record, and when**: only the checkpointer
//! ([`Shared::evict`]), after the index holds the segment durably, the
//! segment is deleted, and the segment's last batch is published; only a
//! state no later batch replaced (its slot's LSN is the segment's), and
//! only a state that may leave memory (terminal records, tombstones,
//! principals, warnings; open records stay for the sweep).
//!
//! **Where the listing invariant lives** ("a listing never misses a record
//! that is only in memory"): [`listing`], the only code that touches the
//! sorted key set, its pending keys and the `evicting` lock.
//!
//! **Lock order**: [`lock_order`] (evicting, leased, a map shard, pending
//! keys, sorted keys, published), checked in debug builds.
//!
//! # Hand-offs checked in production
//!
//! - writer → log thread: each frame's batch number is the one after the
//!   last written ([`log::Log::write`]);
//! - writer → readers: published batch numbers only grow
//!   ([`Shared::publish_batch`]);
//! - checkpointer → map: only published batches are evicted
//!   ([`Shared::evict`]).

mod bloom;
mod checkpoint;
mod core;
mod doorbell;
mod listing;
mod lock_order;
mod log;
mod log_thread;
mod reclaim;
mod shared;
mod stage;
mod writer;

use crossbeam_channel::Sender;
use settle_core::{Command, Reply, TenantId};
use settle_ledger::StoreError;
use tokio::sync::oneshot;

pub use checkpoint::Checkpointer;
pub use core::Core;
pub use doorbell::{Doorbell, Ringing};
pub use log_thread::LogThread;
pub use reclaim::{RECLAIM_BACKLOG, Reclaimer};
pub use shared::{Shared, Slot};
pub use writer::{IN_FLIGHT, Writer};

/// Hashing for in-memory maps: keys come from the tenants' trusted
/// services, and foldhash is randomly seeded; SipHash showed in profiles.
pub type Hasher = foldhash::fast::RandomState;

pub type ReplyTx = oneshot::Sender<Result<Reply, StoreError>>;

/// One command and whom to answer.
pub struct Exec {
    pub tenant: TenantId,
    pub cmd: Command,
    pub reply: ReplyTx,
}

/// Where the answers of a batch message go: all at once, in order.
pub type BatchTx = oneshot::Sender<Vec<Result<Reply, StoreError>>>;

pub enum Msg {
    /// Boxed: the channel's blocks hold a message inline and are zeroed
    /// when allocated, so a 200-byte message cost a 6 KiB `memset` every
    /// 31 commands and two 200-byte copies through the channel.
    Exec(Box<Exec>),
    /// Commands applied in order within one group commit, answered together.
    Batch {
        tenant: TenantId,
        cmds: Vec<Command>,
        reply: BatchTx,
    },
    /// Finish queued work, checkpoint, stop.
    Close(std::sync::mpsc::Sender<()>),
}

pub enum CkptMsg {
    /// Segments up to this one are sealed.
    Sealed(u64),
    Stop(std::sync::mpsc::Sender<()>),
}

/// Where sealed segments go.
pub enum SealSink {
    /// To the checkpointer thread, over a bounded channel: when the
    /// checkpointer is that far behind, the writer waits (backpressure).
    Channel(Sender<CkptMsg>),
    /// Queued for the caller to checkpoint inline.
    Queue(Vec<u64>),
}

/// Runs a closure when dropped (also while unwinding).
pub struct OnDrop<G: FnMut()>(pub G);

impl<G: FnMut()> Drop for OnDrop<G> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// How many commands a message carries (for the admission count).
pub fn commands_in(m: &Msg) -> usize {
    match m {
        Msg::Exec(_) => 1,
        Msg::Batch { cmds, .. } => cmds.len(),
        Msg::Close(_) => 0,
    }
}

fn io_err(e: std::io::Error) -> StoreError {
    StoreError::Io(e.to_string())
}
