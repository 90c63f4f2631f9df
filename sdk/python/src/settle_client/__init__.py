"""settle_client: the Python SDK of settle (SPEC §7, §8, §11).

- ``Client`` / ``AsyncClient``: every SPEC §7 call, typed;
- ``run_once`` / ``run_once_async``: the worker contract of SPEC §11, with
  its failure classes (``EffectNotSent``, ``EffectRefused``), ``resend`` and
  ``dispatch()`` / ``effect_context()`` inside an effect;
- ``fingerprint``: RFC 8785 canonical JSON → SHA-256 (SPEC §11.1);
- ``idempotent``: a Powertools-style decorator;
- ``Reconciler`` / ``AsyncReconciler``: resolve ``unknown`` records by key
  prefix with reconcile hooks (SPEC §11.10), records of the middleware with
  a ``MiddlewareHook`` (told the client's Idempotency-Key and principal);
- ``settle_client.asgi.IdempotencyMiddleware``: SPEC §8 for Starlette/FastAPI,
  with its principal helpers ``fixed_principal`` and ``authenticated_principal``;
  the same for WSGI (``settle_client.wsgi``), Flask (``settle_client.flask``)
  and Django (``settle_client.django``);
- ``settle_client.testing``: the pytest plugin (``settle_server``,
  ``settle_ledger``).
"""

from ._jcs import FingerprintError, canonicalize, fingerprint, select_fields
from .asgi import authenticated_principal, fixed_principal
from .client import AsyncClient, Client, new_claim_id
from .decorator import AsyncIdempotentFunction, IdempotentFunction, Invocation, idempotent
from .errors import (
    BadRequest,
    BindingMismatch,
    DeadlineExceeded,
    EffectNotSent,
    EffectRefused,
    FingerprintMismatch,
    InvalidRequest,
    LeaseExpired,
    NotFound,
    OutcomeUnknown,
    PayloadTooLarge,
    ProblemError,
    RateLimited,
    ReceiptRequired,
    ReconcileRequired,
    RecordRefused,
    Refusal,
    RequestTimeout,
    ResultMismatch,
    ResultNotSerializable,
    SettleError,
    StaleBinding,
    StaleFence,
    TooManyClasses,
    TransportError,
    Unauthorized,
    Unavailable,
    WrongPurpose,
)
from ._mwbase import Committed
from .reconciler import AsyncReconciler, MiddlewareHook, MiddlewareRecord, Reconciler
from .types import (
    BatchResult,
    Binding,
    ClaimDecision,
    Dispatched,
    Grant,
    InFlight,
    LeaseInfo,
    OperationSummary,
    Outcome,
    Page,
    Receipt,
    Record,
    Released,
    Replay,
    Revoked,
    Stats,
    Warning,
)
from .worker import (
    AsyncEffectContext,
    AsyncReconcileHook,
    AsyncReplayHook,
    Done,
    EffectContext,
    Finding,
    ReconcileHook,
    ReplayHook,
    RunResult,
    Serializer,
    dispatch,
    effect_context,
    encode_result,
    run_once,
    run_once_async,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncEffectContext",
    "AsyncIdempotentFunction",
    "AsyncReconcileHook",
    "AsyncReplayHook",
    "AsyncReconciler",
    "BadRequest",
    "BatchResult",
    "Binding",
    "BindingMismatch",
    "ClaimDecision",
    "Committed",
    "Client",
    "DeadlineExceeded",
    "Dispatched",
    "Done",
    "EffectContext",
    "EffectNotSent",
    "EffectRefused",
    "Finding",
    "FingerprintError",
    "FingerprintMismatch",
    "Grant",
    "IdempotentFunction",
    "InFlight",
    "InvalidRequest",
    "Invocation",
    "LeaseExpired",
    "LeaseInfo",
    "MiddlewareHook",
    "MiddlewareRecord",
    "NotFound",
    "OperationSummary",
    "Outcome",
    "OutcomeUnknown",
    "Page",
    "PayloadTooLarge",
    "ProblemError",
    "RateLimited",
    "Receipt",
    "ReceiptRequired",
    "ReconcileHook",
    "ReconcileRequired",
    "Reconciler",
    "Record",
    "RecordRefused",
    "Refusal",
    "Released",
    "Replay",
    "RequestTimeout",
    "ResultMismatch",
    "ResultNotSerializable",
    "Revoked",
    "ReplayHook",
    "RunResult",
    "Serializer",
    "SettleError",
    "StaleBinding",
    "StaleFence",
    "Stats",
    "TooManyClasses",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "Warning",
    "WrongPurpose",
    "authenticated_principal",
    "canonicalize",
    "new_claim_id",
    "dispatch",
    "effect_context",
    "encode_result",
    "fingerprint",
    "fixed_principal",
    "idempotent",
    "run_once",
    "run_once_async",
    "select_fields",
]
