//! # settle-api: the wire types of settle's HTTP API
//!
//! Every JSON body of SPEC §7 (and the list, stats and batch bodies of
//! §9–§10), as plain data that derives `Serialize`, `Deserialize` and
//! `utoipa::ToSchema`: the server, the CLI, the HTTP client, the
//! integration tests and the SDK test vectors all use these types, and the
//! server's OpenAPI document is generated from them. Nothing hand-mirrors
//! them.
//!
//! The wire is decoupled from the core on purpose: these types hold
//! strings, integers and their own enums, and convert to and from the
//! core's commands and replies (`ClaimRequest::into_claim`,
//! `From<&settle_core::Record> for RecordView`, ...). Renaming a field of a
//! core type therefore fails to compile here instead of silently changing
//! the API; the golden tests in `tests/golden.rs` pin every body.
//!
//! Validation happens in the conversions into the core, and every error
//! names the field in the wire's naming (`binding.generation`,
//! `outcome.result`, ...), ready for a 422 problem.

mod batch;
mod hex;
mod inspect;
pub mod num;
mod problem;
mod record;
mod request;
mod response;
mod schema;
mod time;

pub use batch::{
    BatchCall, BatchOp, BatchRequest, BatchResponse, BatchResponseRef, BatchResult, BatchResultRef,
};
pub use inspect::{LeaseSummary, ListResponse, OperationSummary, Stats, StatusCounts};
pub use num::MAX_SAFE_INTEGER;
pub use problem::{Code, Problem, Refusal};
pub use record::{
    Attempt, Call, Lease, LeaseEndReason, LeaseEnded, Observation, Purpose, QuarantineEntry,
    RecordStatus, RecordView, Reservation, Status,
};
pub use request::{
    Binding, BindingCache, ClaimRequest, DispatchRequest, EmptyRequest, Finding, HeartbeatRequest,
    Outcome, OutcomeStatus, ReconcileRequest, ReleaseReason, ReleaseRequest, SettleRequest, Token,
    WarnRequest,
};
pub use response::{
    ClaimDecision, Dispatched, Grant, Health, HealthStatus, LeaseInfo, PrincipalGeneration,
    Receipt, ReceiptResponse, ReconcileResponse, Released, Revoked, Warning, Warnings,
};
pub use schema::CrossFieldRules;
pub use time::Time;

/// The media type of every error body (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The media type of `GET /v1/admin/export` (SPEC §12): the portable
/// export format, lines of `CRC32 SP JSON LF` with a header first and a
/// trailer last (not NDJSON: each line starts with its checksum).
pub const EXPORT_MEDIA_TYPE: &str = "application/vnd.settle.export";

/// The path of the admin export (SPEC §12).
pub const EXPORT_PATH: &str = "/v1/admin/export";
