//! Protocol refusals: expected results of the rules, carried as values.

use serde::{Deserialize, Serialize};

/// Why the ledger refused a call. These are answers, not failures: the
/// request was valid and the ledger's state decided against it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    /// The request's fingerprint differs from the reservation's.
    #[error("fingerprint_mismatch: the fingerprint differs from the reservation")]
    FingerprintMismatch,
    /// The principal or scopes differ from the reservation's.
    #[error("binding_mismatch: the principal or scopes differ from the reservation")]
    BindingMismatch,
    /// The binding's generation is older than the principal's or the reservation's.
    #[error("stale_binding: the binding generation is not current")]
    StaleBinding,
    /// The fence is not the current lease, or that lease already ended by settle or release.
    #[error("stale_fence: the fence does not hold the current lease")]
    StaleFence,
    /// The lease expired, was revoked, or has less than the lease margin left.
    #[error("lease_expired: the lease expired, was revoked or is within the lease margin")]
    LeaseExpired,
    /// The lease is of the other purpose (execute vs reconcile).
    #[error("wrong_purpose: the lease was granted for another purpose")]
    WrongPurpose,
    /// Terminal evidence disagrees with the canonical outcome; the record is now disputed.
    #[error("result_mismatch: the evidence disagrees with the canonical outcome")]
    ResultMismatch,
    /// The lease may have dispatched: it may only end with a receipt.
    #[error("receipt_required: the lease may have dispatched and must be settled")]
    ReceiptRequired,
    /// A task already has the maximum number of warning classes.
    #[error("too_many_classes: the task already has 64 warning classes")]
    TooManyClasses,
    /// No record for this key (or it expired and was collected).
    #[error("not_found: no record for this key")]
    NotFound,
    /// SPEC §6.9: the record carries a receipt dated in the future of the store's clock.
    #[error("record_refused: the record's receipt is dated in the future of the store clock")]
    RecordRefused,
    /// `revoke` at generation 2^64-1.
    #[error("generation_exhausted: the principal's generation cannot be raised further")]
    GenerationExhausted,
}

impl RefusalCode {
    /// The spec's code string.
    pub fn code(self) -> &'static str {
        match self {
            RefusalCode::FingerprintMismatch => "fingerprint_mismatch",
            RefusalCode::BindingMismatch => "binding_mismatch",
            RefusalCode::StaleBinding => "stale_binding",
            RefusalCode::StaleFence => "stale_fence",
            RefusalCode::LeaseExpired => "lease_expired",
            RefusalCode::WrongPurpose => "wrong_purpose",
            RefusalCode::ResultMismatch => "result_mismatch",
            RefusalCode::ReceiptRequired => "receipt_required",
            RefusalCode::TooManyClasses => "too_many_classes",
            RefusalCode::NotFound => "not_found",
            RefusalCode::RecordRefused => "record_refused",
            RefusalCode::GenerationExhausted => "generation_exhausted",
        }
    }

    /// Every refusal code, in declaration order (for exhaustive tests and metrics).
    pub const ALL: [RefusalCode; 12] = [
        RefusalCode::FingerprintMismatch,
        RefusalCode::BindingMismatch,
        RefusalCode::StaleBinding,
        RefusalCode::StaleFence,
        RefusalCode::LeaseExpired,
        RefusalCode::WrongPurpose,
        RefusalCode::ResultMismatch,
        RefusalCode::ReceiptRequired,
        RefusalCode::TooManyClasses,
        RefusalCode::NotFound,
        RefusalCode::RecordRefused,
        RefusalCode::GenerationExhausted,
    ];
}
