"""Typed errors: one class per SPEC §7 problem code, plus the SDK's own.

Every answer of the server that is not a success is a ``ProblemError`` (or a
subclass named after its ``code``); a request that never got an answer is a
``TransportError``. ``problem_error`` maps a problem+json body to its class.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "SettleError",
    "TransportError",
    "LedgerClosed",
    "ProblemError",
    "BadRequest",
    "Unauthorized",
    "NotFound",
    "RequestTimeout",
    "PayloadTooLarge",
    "InvalidRequest",
    "Refusal",
    "FingerprintMismatch",
    "BindingMismatch",
    "StaleBinding",
    "StaleFence",
    "LeaseExpired",
    "WrongPurpose",
    "ResultMismatch",
    "ReceiptRequired",
    "TooManyClasses",
    "Unavailable",
    "RateLimited",
    "RecordRefused",
    "ReconcileRequired",
    "DeadlineExceeded",
    "OutcomeUnknown",
    "EffectNotSent",
    "EffectRefused",
    "ResultNotSerializable",
    "problem_error",
    "PROBLEM_CLASSES",
]


class SettleError(Exception):
    """Base of every error raised by settle_client."""


class TransportError(SettleError):
    """The request got no answer (connection refused, reset, timeout). The
    call may or may not have reached the server."""


class LedgerClosed(SettleError):
    """The local ledger (``settle_local.LocalLedger``) was closed: nothing
    was sent, and no retry can succeed, so none is made (SPEC §11.11).
    Open a new ledger."""


class ProblemError(SettleError):
    """An RFC 9457 problem answer of the server."""

    code: str = "problem"

    def __init__(
        self,
        status: int,
        code: str,
        title: str = "",
        detail: str = "",
        body: Any = None,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {detail or title}")
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.body: Any = body
        self.field: str | None = body.get("field") if isinstance(body, dict) else None
        self.correlation_id: str | None = body.get("correlation_id") if isinstance(body, dict) else None
        # The answer's Retry-After in seconds, when it sent one (503, 429).
        self.retry_after_s = retry_after_s


class BadRequest(ProblemError):
    code = "bad_request"


class Unauthorized(ProblemError):
    code = "unauthorized"


class NotFound(ProblemError):
    code = "not_found"


class RequestTimeout(ProblemError):
    code = "request_timeout"


class PayloadTooLarge(ProblemError):
    code = "payload_too_large"


class InvalidRequest(ProblemError):
    code = "invalid_request"


class Refusal(ProblemError):
    """A 409 protocol refusal (SPEC §7). Never retried with another key or
    fingerprint (SPEC §11.7)."""


class FingerprintMismatch(Refusal):
    code = "fingerprint_mismatch"


class BindingMismatch(Refusal):
    code = "binding_mismatch"


class StaleBinding(Refusal):
    code = "stale_binding"


class StaleFence(Refusal):
    code = "stale_fence"


class LeaseExpired(Refusal):
    code = "lease_expired"


class WrongPurpose(Refusal):
    code = "wrong_purpose"


class ResultMismatch(Refusal):
    code = "result_mismatch"


class ReceiptRequired(Refusal):
    code = "receipt_required"


class TooManyClasses(Refusal):
    code = "too_many_classes"


class Unavailable(ProblemError):
    """503 ``unavailable``: storage failure, overload or shutdown; retryable."""

    code = "unavailable"


class RateLimited(ProblemError):
    """429 (code ``rate_limited``, or any code with status 429): a quota of
    settle or of a proxy in front of it. Retried like a 503 ``unavailable``
    (honouring ``retry_after_s``) by the SDK's retry loops until their
    deadline (SPEC §11.8)."""

    code = "rate_limited"


class RecordRefused(ProblemError):
    """503 ``record_refused`` (SPEC §6.9): the stored record is refused on
    load; an operator must look at it. Not retried."""

    code = "record_refused"


PROBLEM_CLASSES: dict[str, type[ProblemError]] = {
    c.code: c
    for c in (
        BadRequest,
        Unauthorized,
        NotFound,
        RequestTimeout,
        PayloadTooLarge,
        InvalidRequest,
        FingerprintMismatch,
        BindingMismatch,
        StaleBinding,
        StaleFence,
        LeaseExpired,
        WrongPurpose,
        ResultMismatch,
        ReceiptRequired,
        TooManyClasses,
        Unavailable,
        RateLimited,
        RecordRefused,
    )
}


def problem_error(status: int, body: Any, retry_after_s: float | None = None) -> ProblemError:
    """The typed error for a problem answer (unknown codes: ProblemError,
    or Refusal for an unknown 409)."""
    if isinstance(body, dict):
        code = str(body.get("code") or "")
        title = str(body.get("title") or "")
        detail = str(body.get("detail") or "")
    else:
        code, title, detail = "", "", str(body)[:500] if body is not None else ""
    if not code:
        code = {401: "unauthorized", 404: "not_found", 413: "payload_too_large", 429: "rate_limited", 503: "unavailable"}.get(
            status, f"http_{status}"
        )
    cls = PROBLEM_CLASSES.get(code)
    if cls is None:
        cls = Refusal if status == 409 else RateLimited if status == 429 else ProblemError
    return cls(status, code, title, detail, body, retry_after_s=retry_after_s)


# --- errors of the worker contract (SPEC §11) ---------------------------------


class ReconcileRequired(SettleError):
    """SPEC §11.4: the ledger granted a ``reconcile`` lease (an earlier attempt
    may have reached the remote) and no reconcile hook was given, the hook
    answered ``"unavailable"``, or a resend failed (SPEC §11.9; the resent
    effect's error is ``__cause__``). The lease was handed back with
    ``reconcile(unavailable)``: the record stays ``unknown``."""

    def __init__(self, key: str, fence: int, why: str = "no reconcile hook was given") -> None:
        super().__init__(
            f"operation {key!r} needs reconciliation (fence {fence}); {why}. It stays unknown until "
            "resolved: ask the remote whether the effect happened and answer with a reconcile hook "
            "(reconcile=... on run_once or @idempotent), a Reconciler, or client.reconcile(key, ...) "
            "by hand; 'settle list --status unknown' (or client.list(status='unknown')) shows what waits"
        )
        self.key = key
        self.fence = fence


class DeadlineExceeded(SettleError):
    """The caller's deadline passed while waiting (in_flight) or retrying
    (503, transport errors). ``last`` is the last error seen, if any."""

    def __init__(self, message: str, last: BaseException | None = None) -> None:
        super().__init__(message)
        self.last = last


class OutcomeUnknown(SettleError):
    """The operation's outcome is unknown (SPEC §11.11): the effect raised
    after it may have reached the remote, or its outcome could not be
    recorded (a settle refused 422, or unanswered until the deadline), or a
    reconcile hook raised or ran past ``hook_timeout``. The record is (or,
    when its lease lapses, becomes) ``unknown``: reconcile required.
    ``__cause__`` is what happened (the effect's exception, the ledger's
    refusal, the last error, the hook's exception or a ``TimeoutError``);
    ``receipt`` is the ``unknown`` receipt when that settle was answered;
    ``outcome`` is the effect's outcome that could not be recorded (None
    when the effect failed). The message repeats the cause's."""

    def __init__(self, key: str, receipt: Any = None, cause: BaseException | None = None, outcome: Any = None) -> None:
        why = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        super().__init__(f"the outcome of operation {key!r} is unknown; it must be reconciled{why}")
        self.key = key
        self.receipt: Any = receipt
        self.outcome: Any = outcome


class EffectNotSent(SettleError):
    """SPEC §11.8: raise from an effect (or an ``@idempotent`` function, or a
    middleware's handler) when nothing reached the remote: the lease is
    released (``not_dispatched`` when the claim used ``marks_dispatch`` and
    no dispatch was marked, else ``not_committed``: the caller attests that
    nothing was applied) and the next run executes. The run re-raises it;
    the middleware answers 503 ``idempotency_unavailable``, ``Retry-After:
    1``. Under ``marks_dispatch`` any exception raised before the dispatch
    mark counts as this (and is re-raised as it is).

    ``dispatch()`` raises it too when the mark could not be recorded (no
    answer until the deadline; ``__cause__`` is the ``DeadlineExceeded``):
    the effect must not write. That one is the SDK's inference, not the
    caller's word: the SDK releases ``not_dispatched`` and, when the ledger
    had recorded the mark after all (``receipt_required``), settles
    ``unknown`` and raises ``OutcomeUnknown`` (SPEC §11.11)."""


class EffectRefused(SettleError):
    """SPEC §11.8: raise from an effect when the remote refused it for
    certain (a validation error, 409, 425, 429: nothing was applied). The
    lease is released with ``not_committed``, the next run executes, and the
    run re-raises it."""


class ResultNotSerializable(SettleError):
    """The value an effect (or an ``@idempotent`` function, or a reconcile
    hook's ``Done``) returned cannot be stored as JSON: a ``Decimal``, a
    ``datetime``, a set, a class instance, a non-string object key, NaN...,
    and no ``default=`` serializer turned it into JSON. ``type_name`` names
    the value's type and ``path`` (a JSON pointer) where it sits in the
    result.

    Before the dispatch mark (``marks_dispatch``) the lease is released and
    this error is raised: the key is usable again. After it (or without
    ``marks_dispatch``) the effect may have happened: the record is settled
    ``unknown`` with this message as the attempt's error, and
    ``OutcomeUnknown`` is raised with this error as its ``__cause__``.
    Never silently run again."""

    def __init__(self, type_name: str, path: str, reason: str | None = None) -> None:
        where = f" at {path}" if path else ""
        what = reason or f"{type_name} is not a JSON value"
        super().__init__(
            f"the result cannot be stored as JSON: {what}{where}; register a serializer with default= "
            "(run_once, run_once_async, @idempotent; like json.dumps's default: a function called with every "
            "value that is not JSON, returning a JSON value or raising TypeError), e.g. default=str for "
            "Decimal, or lambda o: o.isoformat() for datetime"
        )
        self.type_name = type_name
        self.path = path
