//! # settle-embedded: the ledger on local disk
//!
//! The default store: a single writer thread applies every command through
//! the pure core, group-commits each batch into a checksummed log with one
//! `write` + `fdatasync`, and only then answers the callers. A checkpointer
//! moves state into a fjall index off the critical path and truncates the
//! log, so settled records leave RAM. See `docs/design.md` for the format,
//! the commit protocol and the crash analysis.
//!
//! The log and recovery run over an I/O seam ([`fs::Fs`]) and the index
//! behind a trait ([`index::Index`]): the same engine runs on the real
//! filesystem with fjall ([`EmbeddedStore::open`]), or on another
//! implementation of the two (the simulated disk and in-memory index of
//! `settle-sim`'s `disk` module), threaded ([`EmbeddedStore::open_on`]) or
//! inline on the caller's thread ([`InlineStore`], deterministic).

#[cfg(not(feature = "fuzzing"))]
mod codec;
// The fuzz targets (fuzz/, docs/testing.md) decode log frames and stored
// values from arbitrary bytes; the format stays private otherwise.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
#[allow(missing_docs)]
pub mod codec;
mod engine;
pub mod fs;
pub mod index;
mod inline;
mod offline;
mod open;
mod options;
mod pace;
mod portable;
mod reads;
mod record_codec;
mod recovery;
mod threaded;
mod wal;

#[cfg(test)]
mod format_tests;

// The engine's parts the stores are built from (open.rs, threaded.rs,
// inline.rs, offline.rs and reads.rs take them from here).
use crate::engine::{
    Checkpointer, CkptMsg, Core, Hasher, LogThread, Msg, SealSink, Shared, Slot, Writer,
};

pub use crate::inline::InlineStore;
pub use crate::offline::{ScanReport, scan};
pub use crate::options::EmbeddedOptions;
pub use crate::portable::{export_dir, import};
pub use crate::threaded::EmbeddedStore;
#[cfg(feature = "faults")]
pub use crate::wal::{CheckpointStep, Faults};
