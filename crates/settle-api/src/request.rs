//! Request bodies of SPEC §7 and their conversion into the core's commands.
//!
//! The bodies hold plain data; `into_*` validates every field (the key
//! syntax, digests, ranges, the safe integer range of SPEC §2) and names
//! the offending one. The reverse conversions (`From<&settle_core::Claim>`
//! ...) are what a client sends for a command.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use settle_core as core;
use settle_core::{InvalidInput, Key, RetentionS};
use utoipa::ToSchema;

use crate::num::{check_safe, opt_whole, whole};

fn digest(field: &str, s: &str) -> Result<core::Digest, InvalidInput> {
    crate::hex::decode(field, s)
}

/// SPEC §2: a fence is in [1, 2^53 − 1]; fences start at 1, so 0 is no
/// fence at all (422, not a `stale_fence` quarantined under fence 0,
/// which no record may hold: found by schemathesis).
fn fence(v: u64) -> Result<core::Fence, InvalidInput> {
    if v == 0 {
        return Err(InvalidInput::new("fence", "fences start at 1"));
    }
    check_safe("fence", v).map(core::Fence)
}

/// The authorization an operation runs under (SPEC §2).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// 1–255 bytes of visible ASCII.
    #[schema(min_length = 1, max_length = 255, pattern = "^[!-~]{1,255}$")]
    pub principal: String,
    /// Order irrelevant; stored sorted and de-duplicated; at most 64, each
    /// 1–255 bytes of visible ASCII.
    #[serde(default)]
    #[schema(max_items = 64, inline, value_type = Vec<Token>)]
    pub scopes: Vec<String>,
    /// Raised by re-authentication; an integer in [0, 2^53 − 1].
    #[serde(deserialize_with = "whole")]
    #[schema(minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    pub generation: u64,
}

/// The schema of a string of the key syntax (SPEC §2): 1–255 bytes of
/// visible ASCII. Keys, principals, scopes, tasks and classes.
pub struct Token;

impl utoipa::PartialSchema for Token {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(255))
            .pattern(Some("^[!-~]{1,255}$"))
            .into()
    }
}
impl ToSchema for Token {}

impl Binding {
    /// Validates into the core's binding; errors name `{prefix}.principal` ...
    pub fn to_core(&self, prefix: &str) -> Result<core::Binding, InvalidInput> {
        self.clone().into_core(prefix)
    }

    /// [`Binding::to_core`], moving the strings instead of copying them.
    /// The field names are written only for an error (a `format!` per
    /// field per call showed in the profile).
    pub fn into_core(self, prefix: &str) -> Result<core::Binding, InvalidInput> {
        let principal = core::Principal::new(self.principal)
            .map_err(|e| InvalidInput::new(format!("{prefix}.principal"), e.reason))?;
        let scopes = core::Scopes::from_strs(self.scopes)
            .map_err(|e| InvalidInput::new(e.field.replacen("binding", prefix, 1), e.reason))?;
        let generation = check_safe(prefix, self.generation)
            .map_err(|e| InvalidInput::new(format!("{prefix}.generation"), e.reason))?;
        Ok(core::Binding {
            principal,
            scopes,
            generation,
        })
    }
}

/// The last binding converted by [`Binding::into_core`], and what it
/// gave: the calls of one batch are mostly made under one binding, which
/// is then validated and allocated once (`POST /v1/batch`).
#[derive(Debug, Default)]
pub struct BindingCache {
    last: Option<(Binding, core::Binding)>,
}

impl BindingCache {
    /// [`Binding::into_core`]; the same binding as the last one converted
    /// gives that one's result again (the prefix only names errors, and an
    /// error is never kept).
    pub fn into_core(&mut self, b: Binding, prefix: &str) -> Result<core::Binding, InvalidInput> {
        if let Some((raw, converted)) = &self.last
            && *raw == b
        {
            return Ok(converted.clone());
        }
        let converted = b.clone().into_core(prefix)?;
        self.last = Some((b, converted.clone()));
        Ok(converted)
    }
}

impl From<&core::Binding> for Binding {
    fn from(b: &core::Binding) -> Binding {
        Binding {
            principal: b.principal.to_string(),
            scopes: b.scopes.as_slice().iter().map(|s| s.to_string()).collect(),
            generation: b.generation,
        }
    }
}

/// What a worker may report in `settle`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    /// The effect happened; the result is attached.
    Completed,
    /// The upstream definitively failed it; the result is attached.
    Failed,
    /// The worker may have sent and does not know what happened.
    Unknown,
}

impl From<core::OutcomeStatus> for OutcomeStatus {
    fn from(s: core::OutcomeStatus) -> OutcomeStatus {
        match s {
            core::OutcomeStatus::Completed => OutcomeStatus::Completed,
            core::OutcomeStatus::Failed => OutcomeStatus::Failed,
            core::OutcomeStatus::Unknown => OutcomeStatus::Unknown,
        }
    }
}
impl From<OutcomeStatus> for core::OutcomeStatus {
    fn from(s: OutcomeStatus) -> core::OutcomeStatus {
        match s {
            OutcomeStatus::Completed => core::OutcomeStatus::Completed,
            OutcomeStatus::Failed => core::OutcomeStatus::Failed,
            OutcomeStatus::Unknown => core::OutcomeStatus::Unknown,
        }
    }
}

/// A reported outcome. `completed` and `failed` require `result` (JSON
/// `null` is a result) and `response_sha256`; `unknown` refuses `result`
/// and may carry `response_sha256` and `error`.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// What happened upstream.
    pub status: OutcomeStatus,
    /// Any JSON document (`null` included): at most `max_result_bytes` of
    /// compact text, arrays and objects nested at most 64 deep. Stored as
    /// sent (whitespace between tokens removed) and replayed byte for byte.
    /// Absent is "no result"; present `null` is the result `null`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<serde_json::Value>)]
    pub result: Option<Box<RawValue>>,
    /// Lowercase hex SHA-256 of the upstream's raw response.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub response_sha256: Option<String>,
    /// Any text of at most 4096 bytes (empty and multi-line included).
    #[schema(max_length = 4096)]
    pub error: Option<String>,
}

impl PartialEq for Outcome {
    fn eq(&self, o: &Outcome) -> bool {
        self.status == o.status
            && self.result.as_ref().map(|r| r.get()) == o.result.as_ref().map(|r| r.get())
            && self.response_sha256 == o.response_sha256
            && self.error == o.error
    }
}

/// A present `result` is a result, `null` included.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

impl Outcome {
    /// Validates into the core's outcome. The result's size is checked
    /// later against the server's configured `max_result_bytes`.
    pub fn to_core(&self) -> Result<core::Outcome, InvalidInput> {
        let result = match &self.result {
            Some(raw) => Some(core::ResultJson::from_text(raw.get(), usize::MAX)?),
            None => None,
        };
        let response_sha256 = match &self.response_sha256 {
            Some(s) => Some(digest("outcome.response_sha256", s)?),
            None => None,
        };
        let error = match &self.error {
            Some(s) => Some(core::ErrorText::new("outcome.error", s.clone())?),
            None => None,
        };
        core::Outcome::new(self.status.into(), result, response_sha256, error)
    }
}

impl From<&core::Outcome> for Outcome {
    fn from(o: &core::Outcome) -> Outcome {
        Outcome {
            status: o.status().into(),
            result: o.result().map(raw),
            response_sha256: o.response_sha256().map(|d| crate::hex::encode(&d)),
            error: o.error().map(|e| e.to_string()),
        }
    }
}

/// The settled text as a raw JSON value, byte for byte.
pub(crate) fn raw(r: &core::ResultJson) -> Box<RawValue> {
    RawValue::from_string(r.as_str().to_string())
        .expect("a stored result is valid JSON (checked when it was built and decoded)")
}

/// `POST /v1/operations/{key}/claim`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Lowercase hex SHA-256 of the effect-defining fields of the request.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub fingerprint: String,
    /// The authorization the caller runs under; principal and scopes must match the reservation.
    pub binding: Binding,
    /// Lease duration in milliseconds; default 30000.
    #[serde(
        default,
        deserialize_with = "opt_whole",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 100, maximum = 3600000)]
    pub lease_ms: Option<u64>,
    /// Free text naming the worker (1–4096 bytes, no control characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub worker: Option<String>,
    /// The worker will call `dispatch` before the remote write; default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub marks_dispatch: bool,
    /// Kept this long after settlement, in seconds; default the server's
    /// `default_retention_s` (86400).
    #[serde(
        default,
        deserialize_with = "opt_whole",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 31536000)]
    pub retention_s: Option<u64>,
    /// The caller's random id for this claim (at least 96 bits), sent again
    /// only when it retries this same claim because the answer was lost:
    /// while the lease granted to it lives, the retry gets the same grant
    /// (claim rule 5a).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 16, max_length = 64, pattern = "^[A-Za-z0-9_-]{16,64}$")]
    pub claim_id: Option<String>,
}

impl ClaimRequest {
    /// The claim on `key`; `default_retention` when the body names none.
    pub fn into_claim(
        self,
        key: Key,
        default_retention: RetentionS,
    ) -> Result<core::Claim, InvalidInput> {
        self.into_claim_with(key, default_retention, |b| b.into_core("binding"))
    }

    /// [`ClaimRequest::into_claim`], the binding converted through `cache`.
    pub fn into_claim_cached(
        self,
        key: Key,
        default_retention: RetentionS,
        cache: &mut BindingCache,
    ) -> Result<core::Claim, InvalidInput> {
        self.into_claim_with(key, default_retention, |b| cache.into_core(b, "binding"))
    }

    fn into_claim_with(
        self,
        key: Key,
        default_retention: RetentionS,
        binding: impl FnOnce(Binding) -> Result<core::Binding, InvalidInput>,
    ) -> Result<core::Claim, InvalidInput> {
        let fingerprint = digest("fingerprint", &self.fingerprint)?;
        let binding = binding(self.binding)?;
        let lease_ms = match self.lease_ms {
            Some(ms) => core::LeaseMs::new(ms)?,
            None => core::LeaseMs::DEFAULT,
        };
        let worker = match self.worker {
            Some(w) => Some(core::Text::new("worker", w)?),
            None => None,
        };
        let retention_s = match self.retention_s {
            Some(s) => RetentionS::new(s)?,
            None => default_retention,
        };
        let claim_id = match self.claim_id {
            Some(id) => Some(core::ClaimId::new(id)?),
            None => None,
        };
        Ok(core::Claim {
            key,
            fingerprint,
            binding,
            lease_ms,
            worker,
            marks_dispatch: self.marks_dispatch,
            retention_s,
            claim_id,
        })
    }
}

impl From<&core::Claim> for ClaimRequest {
    fn from(c: &core::Claim) -> ClaimRequest {
        ClaimRequest {
            fingerprint: crate::hex::encode(&c.fingerprint),
            binding: (&c.binding).into(),
            lease_ms: Some(c.lease_ms.get()),
            worker: c.worker.as_ref().map(|w| w.to_string()),
            marks_dispatch: c.marks_dispatch,
            retention_s: Some(c.retention_s.get()),
            claim_id: c.claim_id.as_ref().map(|id| id.as_str().to_string()),
        }
    }
}

/// `POST /v1/operations/{key}/heartbeat`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The fence of the lease to extend.
    #[serde(deserialize_with = "whole")]
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// New lease duration from now; default the lease's original `lease_ms`.
    #[serde(
        default,
        deserialize_with = "opt_whole",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 100, maximum = 3600000)]
    pub lease_ms: Option<u64>,
}

impl HeartbeatRequest {
    /// Validates into the core's heartbeat on `key`; errors name the wire field.
    pub fn into_heartbeat(self, key: Key) -> Result<core::Heartbeat, InvalidInput> {
        Ok(core::Heartbeat {
            key,
            fence: fence(self.fence)?,
            lease_ms: self.lease_ms.map(core::LeaseMs::new).transpose()?,
        })
    }
}

impl From<&core::Heartbeat> for HeartbeatRequest {
    fn from(h: &core::Heartbeat) -> HeartbeatRequest {
        HeartbeatRequest {
            fence: h.fence.0,
            lease_ms: h.lease_ms.map(|m| m.get()),
        }
    }
}

/// `POST /v1/operations/{key}/dispatch`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DispatchRequest {
    /// The fence of the `execute` lease whose holder is about to write remotely.
    #[serde(deserialize_with = "whole")]
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
}

impl DispatchRequest {
    /// Validates into the core's dispatch on `key`; errors name the wire field.
    pub fn into_dispatch(self, key: Key) -> Result<core::Dispatch, InvalidInput> {
        Ok(core::Dispatch {
            key,
            fence: fence(self.fence)?,
        })
    }
}

impl From<&core::Dispatch> for DispatchRequest {
    fn from(d: &core::Dispatch) -> DispatchRequest {
        DispatchRequest { fence: d.fence.0 }
    }
}

/// `POST /v1/operations/{key}/settle`.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    /// The fence of the lease the outcome was produced under.
    #[serde(deserialize_with = "whole")]
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// Lowercase hex SHA-256 of the effect-defining fields of the executed request.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub fingerprint: String,
    /// The binding the effect ran under.
    pub binding: Binding,
    /// What happened upstream.
    pub outcome: Outcome,
}

impl SettleRequest {
    /// Validates into the core's settle on `key`; errors name the wire field. The
    /// result's size is checked later against the server's `max_result_bytes`.
    pub fn into_settle(self, key: Key) -> Result<core::Settle, InvalidInput> {
        self.into_settle_with(key, |b| b.into_core("binding"))
    }

    /// [`SettleRequest::into_settle`], the binding converted through `cache`.
    pub fn into_settle_cached(
        self,
        key: Key,
        cache: &mut BindingCache,
    ) -> Result<core::Settle, InvalidInput> {
        self.into_settle_with(key, |b| cache.into_core(b, "binding"))
    }

    fn into_settle_with(
        self,
        key: Key,
        binding: impl FnOnce(Binding) -> Result<core::Binding, InvalidInput>,
    ) -> Result<core::Settle, InvalidInput> {
        Ok(core::Settle {
            key,
            fence: fence(self.fence)?,
            fingerprint: digest("fingerprint", &self.fingerprint)?,
            binding: binding(self.binding)?,
            outcome: self.outcome.to_core()?,
        })
    }
}

impl From<&core::Settle> for SettleRequest {
    fn from(s: &core::Settle) -> SettleRequest {
        SettleRequest {
            fence: s.fence.0,
            fingerprint: crate::hex::encode(&s.fingerprint),
            binding: (&s.binding).into(),
            outcome: (&s.outcome).into(),
        }
    }
}

/// Why a holder releases its `execute` lease without a receipt.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseReason {
    /// Nothing was sent (`marks_dispatch` and no `dispatch`).
    #[default]
    NotDispatched,
    /// The remote definitively refused the effect (a validation error,
    /// 409, 425, 429); allowed after `dispatch`.
    NotCommitted,
}

impl From<core::ReleaseReason> for ReleaseReason {
    fn from(r: core::ReleaseReason) -> ReleaseReason {
        match r {
            core::ReleaseReason::NotDispatched => ReleaseReason::NotDispatched,
            core::ReleaseReason::NotCommitted => ReleaseReason::NotCommitted,
        }
    }
}
impl From<ReleaseReason> for core::ReleaseReason {
    fn from(r: ReleaseReason) -> core::ReleaseReason {
        match r {
            ReleaseReason::NotDispatched => core::ReleaseReason::NotDispatched,
            ReleaseReason::NotCommitted => core::ReleaseReason::NotCommitted,
        }
    }
}

/// `POST /v1/operations/{key}/release`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The fence of the `execute` lease to release.
    #[serde(deserialize_with = "whole")]
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// `not_dispatched` (default) or `not_committed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ReleaseReason>,
    /// Remove the record as if collected (default false): allowed only when
    /// it would be `pending` with no receipt, no reconciliation owed, no
    /// dispute and no quarantine, else `receipt_required` (a request refused
    /// before any work, such as a framework's validation error).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forget: bool,
}

impl ReleaseRequest {
    /// Validates into the core's release on `key` (`not_dispatched` when no reason).
    pub fn into_release(self, key: Key) -> Result<core::Release, InvalidInput> {
        Ok(core::Release {
            key,
            fence: fence(self.fence)?,
            reason: self.reason.unwrap_or_default().into(),
            forget: self.forget,
        })
    }
}

impl From<&core::Release> for ReleaseRequest {
    fn from(r: &core::Release) -> ReleaseRequest {
        ReleaseRequest {
            fence: r.fence.0,
            reason: Some(r.reason.into()),
            forget: r.forget,
        }
    }
}

/// What a reconciling worker found out about the remote effect.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// The effect happened: `fingerprint`, `binding` and a terminal `outcome` are required.
    Committed,
    /// The remote confirms the effect did not happen.
    NotCommitted,
    /// The remote could not be asked.
    Unavailable,
}

impl From<core::FindingKind> for Finding {
    fn from(f: core::FindingKind) -> Finding {
        match f {
            core::FindingKind::Committed => Finding::Committed,
            core::FindingKind::NotCommitted => Finding::NotCommitted,
            core::FindingKind::Unavailable => Finding::Unavailable,
        }
    }
}

/// `POST /v1/operations/{key}/reconcile`. `fingerprint`, `binding` and a
/// terminal `outcome` are required with `committed` and refused otherwise.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileRequest {
    /// The fence of the `reconcile` lease.
    #[serde(deserialize_with = "whole")]
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_u64)]
    pub fence: u64,
    /// What the worker found out.
    pub finding: Finding,
    /// With `committed`: the fingerprint of the request the effect belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub fingerprint: Option<String>,
    /// With `committed`: the binding it ran under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<Binding>,
    /// With `committed`: the terminal outcome (`completed` or `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

impl ReconcileRequest {
    /// Validates into the core's reconcile on `key`, including the fields
    /// `committed` requires and the others refuse; errors name the wire field.
    pub fn into_reconcile(self, key: Key) -> Result<core::Reconcile, InvalidInput> {
        let fence = fence(self.fence)?;
        let finding = match self.finding {
            Finding::Committed => {
                let missing = |f: &str| InvalidInput::new(f, "is required with finding committed");
                let fingerprint = self.fingerprint.ok_or_else(|| missing("fingerprint"))?;
                let binding = self.binding.ok_or_else(|| missing("binding"))?;
                let outcome = self.outcome.ok_or_else(|| missing("outcome"))?;
                core::Finding::committed(
                    digest("fingerprint", &fingerprint)?,
                    binding.into_core("binding")?,
                    outcome.to_core()?,
                )?
            }
            kind => {
                let extra = [
                    ("fingerprint", self.fingerprint.is_some()),
                    ("binding", self.binding.is_some()),
                    ("outcome", self.outcome.is_some()),
                ];
                if let Some((field, _)) = extra.iter().find(|(_, present)| *present) {
                    return Err(InvalidInput::new(
                        *field,
                        "is only allowed with finding committed",
                    ));
                }
                match kind {
                    Finding::NotCommitted => core::Finding::NotCommitted,
                    _ => core::Finding::Unavailable,
                }
            }
        };
        Ok(core::Reconcile {
            key,
            fence,
            finding,
        })
    }
}

impl From<&core::Reconcile> for ReconcileRequest {
    fn from(r: &core::Reconcile) -> ReconcileRequest {
        let (finding, fingerprint, binding, outcome) = match &r.finding {
            core::Finding::Committed(c) => (
                Finding::Committed,
                Some(crate::hex::encode(c.fingerprint())),
                Some(c.binding().into()),
                Some(c.outcome().into()),
            ),
            core::Finding::NotCommitted => (Finding::NotCommitted, None, None, None),
            core::Finding::Unavailable => (Finding::Unavailable, None, None, None),
        };
        ReconcileRequest {
            fence: r.fence.0,
            finding,
            fingerprint,
            binding,
            outcome,
        }
    }
}

/// `POST /v1/tasks/{task}/warnings/{class}`.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WarnRequest {
    /// Replaces the stored detail; omitted keeps it. 1–4096 bytes, no
    /// control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 4096,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub detail: Option<String>,
}

impl WarnRequest {
    /// Validates into the core's warn of `class` on `task`; errors name the wire field.
    pub fn into_warn(
        self,
        task: core::TaskId,
        class: core::WarningClass,
    ) -> Result<core::Warn, InvalidInput> {
        Ok(core::Warn {
            task,
            class,
            detail: self
                .detail
                .map(|d| core::Text::new("detail", d))
                .transpose()?,
        })
    }
}

impl From<&core::Warn> for WarnRequest {
    fn from(w: &core::Warn) -> WarnRequest {
        WarnRequest {
            detail: w.detail.as_ref().map(|d| d.to_string()),
        }
    }
}

/// A body with no fields (`revoke`); anything but `{}` or an empty body is refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}

#[cfg(test)]
mod fence_tests {
    use super::*;

    /// SPEC §2: fences start at 1; a fence of 0 is invalid (422) before
    /// anything is read or written.
    #[test]
    fn a_fence_of_zero_is_invalid() {
        let key = Key::new("k").unwrap();
        let e = HeartbeatRequest {
            fence: 0,
            lease_ms: None,
        }
        .into_heartbeat(key.clone())
        .unwrap_err();
        assert_eq!(e.field, "fence");
        assert!(
            DispatchRequest { fence: 0 }
                .into_dispatch(key.clone())
                .is_err()
        );
        assert_eq!(
            DispatchRequest { fence: 1 }
                .into_dispatch(key)
                .unwrap()
                .fence,
            core::Fence(1)
        );
    }
}

#[cfg(test)]
mod binding_cache_tests {
    use super::*;

    fn b(principal: &str, scopes: &[&str], generation: u64) -> Binding {
        Binding {
            principal: principal.into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            generation,
        }
    }

    #[test]
    fn a_repeated_binding_is_converted_once_and_others_convert_on_their_own() {
        let mut cache = BindingCache::default();
        let first = cache
            .into_core(b("svc", &["pay", "a"], 1), "binding")
            .unwrap();
        let again = cache
            .into_core(b("svc", &["pay", "a"], 1), "binding")
            .unwrap();
        assert_eq!(first, again);
        // The same allocation: not converted a second time.
        assert_eq!(
            first.principal.as_str().as_ptr(),
            again.principal.as_str().as_ptr()
        );
        // Any field differing gives that binding's own conversion.
        for other in [
            b("svc", &["pay", "a"], 2),
            b("svc", &["pay"], 1),
            b("svc2", &["pay", "a"], 1),
        ] {
            let direct = other.clone().into_core("binding").unwrap();
            assert_eq!(cache.into_core(other, "binding").unwrap(), direct);
        }
    }

    #[test]
    fn an_invalid_binding_fails_every_time_and_is_never_kept() {
        let mut cache = BindingCache::default();
        let good = cache.into_core(b("svc", &["pay"], 0), "binding").unwrap();
        for _ in 0..2 {
            let e = cache
                .into_core(b("svc", &["pay", ""], 0), "binding")
                .unwrap_err();
            assert_eq!(e.field, "binding.scopes[1]");
        }
        assert_eq!(
            cache.into_core(b("svc", &["pay"], 0), "binding").unwrap(),
            good
        );
    }
}
