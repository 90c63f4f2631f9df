//! # settle-worker: the Rust worker SDK (SPEC §11)
//!
//! * [`fingerprint`]: the canonical fingerprint of a request (SHA-256 of its
//!   RFC 8785 canonical JSON, or of chosen fields), identical in the Rust,
//!   Python and TypeScript SDKs.
//! * [`Transport`]: how the worker reaches the ledger, implemented by the
//!   in-process ledger ([`LedgerTransport`]) and by `settle_client::Client`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod fingerprint;
mod transport;

pub use fingerprint::{
    FingerprintError, canonicalize, fingerprint, fingerprint_fields, select_fields, sha256,
};
pub use transport::{LedgerTransport, Transport, TransportError};
