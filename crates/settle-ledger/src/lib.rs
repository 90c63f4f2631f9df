//! # settle-ledger
//!
//! The [`Ledger`] API over the [`Store`] trait, the in-memory [`MemStore`],
//! the `conformance` suite every engine must pass and the `crash` harness
//! every crash test runs (feature `conformance`).
//!
//! ```
//! use std::sync::Arc;
//! use settle_core::*;
//! use settle_ledger::{Ledger, MemStore};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let ledger = Ledger::new(Arc::new(MemStore::default()));
//! let tenant = TenantId::default_tenant();
//! let binding = Binding {
//!     principal: Principal::new("svc-billing").unwrap(),
//!     scopes: Scopes::from_strs(["charge"]).unwrap(),
//!     generation: 0,
//! };
//! let fingerprint = Digest::parse("fingerprint", &"ab".repeat(32)).unwrap();
//! let key = Key::new("order-42").unwrap();
//!
//! // First claim: go ahead, under this fence.
//! let d = ledger.claim(&tenant, Claim::new(key.clone(), fingerprint, binding.clone())).await.unwrap();
//! let ClaimDecision::Execute(grant) = d else { panic!() };
//!
//! // ... charge the card, passing `key` and `grant.fence` to the remote ...
//!
//! let outcome = Outcome::completed(
//!     ResultJson::from_value(&serde_json::json!({"charge": "ch_1"}), 65536).unwrap(),
//!     Digest::parse("response_sha256", &"cd".repeat(32)).unwrap(),
//! );
//! let receipt = ledger
//!     .settle(&tenant, Settle { key: key.clone(), fence: grant.fence, fingerprint, binding: binding.clone(), outcome })
//!     .await
//!     .unwrap();
//! assert!(receipt.durable);
//!
//! // Every retry learns the one true outcome.
//! let again = ledger.claim(&tenant, Claim::new(key, fingerprint, binding)).await.unwrap();
//! assert!(matches!(again, ClaimDecision::Replay { .. }));
//! # });
//! ```

pub mod bench;
/// The engine conformance suite (behind the `conformance` feature: not in
/// production builds).
#[cfg(feature = "conformance")]
pub mod conformance;
/// The load-until-crash harness of every crash test (behind the
/// `conformance` feature: not in production builds).
#[cfg(feature = "conformance")]
pub mod crash;
pub mod export;
pub mod inspect;
mod ledger;
mod memory;
pub mod rounds;
mod store;

pub use ledger::{Ledger, LedgerConfig, LedgerError, Reconciled};
pub use memory::MemStore;
pub use store::{
    BoxFuture, Clock, Part, Snapshot, Store, StoreError, StoreStats, SweepReport, panic_message,
};
