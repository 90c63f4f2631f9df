//! # settle-core: the rule book
//!
//! The whole protocol of SPEC §2–§6 as plain data and pure functions: the
//! reservation, fenced leases, the status lattice, the claim and settle
//! rules, quarantine, warnings and the invariants. No I/O, no async, no
//! clock, no randomness: `now` and the next fence come in through [`Ctx`].
//!
//! Every engine (in-memory, embedded, PostgreSQL) and the server call
//! [`apply`], so the semantics cannot drift between them.
//!
//! Where each rule lives:
//! - claim rules 1–8: [`rules::claim`]
//! - lease expiry and revocation: [`rules::end_lapsed_lease`], [`rules::expire`]
//! - heartbeat, dispatch, release: [`rules::heartbeat`], [`rules::dispatch`], [`rules::release`]
//! - settle rules 0–4: [`rules::settle`] (rules 2–4 are shared with `reconcile(committed)`)
//! - reconcile: [`rules::reconcile`]
//! - revoke, warn: [`rules::revoke`], [`rules::warn`]
//! - retention: [`rules::collect`] and the prelude of every record rule
//! - invariants of §6: [`invariants`], also asserted inside [`apply`]

pub mod command;
pub mod invariants;
pub mod legacy;
pub mod record;
pub mod refusal;
pub mod rules;
/// Builders for tests (behind the `testkit` feature: not in production builds).
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod types;
pub mod world;

pub use command::{
    Claim, ClaimDecision, Command, CommittedFinding, Dispatch, Finding, Grant, Heartbeat,
    LeaseInfo, Reconcile, Release, ReleaseReason, Reply, Revoke, Settle, Target, Warn,
};
pub use invariants::{check_principal, check_record};
pub use record::{
    Attempt, Call, Ended, FindingKind, Lease, LeaseEnd, Move, Observation, Outcome, OutcomeStatus,
    PrincipalState, Purpose, QuarantineEntry, Receipt, Record, Reservation, Status, Warning,
};
pub use refusal::RefusalCode;
pub use rules::{Applied, Ctx, Limits, OpState, Principals, apply, principals_needed, view_at};
pub use types::{
    Binding, ClaimId, DEFAULT_MAX_RESULT_BYTES, Digest, ErrorText, Fence, InvalidInput, Key,
    LeaseMs, MAX_RESULT_DEPTH, Principal, ResultJson, RetentionS, Scope, Scopes, TaskId, TenantId,
    Text, Timestamp, WarningClass,
};
pub use world::World;
