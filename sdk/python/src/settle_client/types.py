"""Typed views of the SPEC §7 answers (frozen dataclasses).

Fences and generations are Python ints, exact over the whole SPEC §2 range
[0, 2^53 − 1]. Timestamps stay RFC 3339 strings, as the server sends them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Union

from .errors import ProblemError, problem_error

__all__ = [
    "JSON",
    "Binding",
    "Outcome",
    "Receipt",
    "Grant",
    "InFlight",
    "Replay",
    "ClaimDecision",
    "LeaseInfo",
    "Dispatched",
    "Released",
    "Revoked",
    "Warning",
    "Record",
    "OperationSummary",
    "Page",
    "Stats",
    "BatchResult",
    "OutcomeStatus",
    "MAX_SAFE_INTEGER",
]

JSON = Any
"""Any JSON value (dict, list, str, int, float, bool, None)."""

MAX_SAFE_INTEGER = 2**53 - 1
OutcomeStatus = Literal["completed", "failed", "unknown"]


@dataclass(frozen=True)
class Binding:
    """The authorization an operation runs under (SPEC §2)."""

    principal: str
    scopes: tuple[str, ...] = ()
    generation: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"principal": self.principal, "scopes": list(self.scopes), "generation": self.generation}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Binding:
        return Binding(str(d["principal"]), tuple(d.get("scopes") or ()), int(d.get("generation", 0)))


@dataclass(frozen=True)
class Outcome:
    """A reported or canonical outcome (SPEC §4 settle)."""

    status: str
    result: JSON = None
    response_sha256: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"status": self.status}
        if self.status in ("completed", "failed") or self.result is not None:
            d["result"] = self.result
        if self.response_sha256 is not None:
            d["response_sha256"] = self.response_sha256
        if self.error is not None:
            d["error"] = self.error
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> Outcome:
        return Outcome(str(d["status"]), d.get("result"), d.get("response_sha256"), d.get("error"))


@dataclass(frozen=True)
class Receipt:
    """The durable proof of a settlement (SPEC §2)."""

    key: str
    fingerprint: str
    status: str
    fence: int
    committed_at: str
    durable: bool
    response_sha256: str | None = None

    @staticmethod
    def from_json(d: dict[str, Any]) -> Receipt:
        return Receipt(
            key=str(d["key"]),
            fingerprint=str(d["fingerprint"]),
            status=str(d["status"]),
            fence=int(d["fence"]),
            committed_at=str(d["committed_at"]),
            durable=bool(d["durable"]),
            response_sha256=d.get("response_sha256"),
        )


@dataclass(frozen=True)
class Grant:
    """``execute`` or ``reconcile``: a lease under ``fence``."""

    decision: Literal["execute", "reconcile"]
    fence: int
    lease_expires_at: str
    attempt: int


@dataclass(frozen=True)
class InFlight:
    """Another worker holds a live lease; claim again after ``retry_after_ms``.
    ``lease_expires_at``: when that lease expires (RFC 3339; None from a
    server that does not say)."""

    retry_after_ms: int
    decision: Literal["in_flight"] = "in_flight"
    lease_expires_at: str | None = None


@dataclass(frozen=True)
class Replay:
    """The operation is terminal: its canonical outcome and receipt."""

    outcome: Outcome
    receipt: Receipt
    decision: Literal["replay"] = "replay"


ClaimDecision = Union[Grant, InFlight, Replay]


def claim_decision(d: dict[str, Any]) -> ClaimDecision:
    dec = d.get("decision")
    if dec in ("execute", "reconcile"):
        return Grant(dec, int(d["fence"]), str(d["lease_expires_at"]), int(d["attempt"]))
    if dec == "in_flight":
        at = d.get("lease_expires_at")
        return InFlight(int(d["retry_after_ms"]), lease_expires_at=None if at is None else str(at))
    if dec == "replay":
        return Replay(Outcome.from_json(d["outcome"]), Receipt.from_json(d["receipt"]))
    raise ValueError(f"unknown claim decision {dec!r}")


@dataclass(frozen=True)
class LeaseInfo:
    fence: int
    lease_expires_at: str


@dataclass(frozen=True)
class Dispatched:
    fence: int
    lease_expires_at: str
    dispatched: bool


@dataclass(frozen=True)
class Released:
    fence: int
    released: bool


@dataclass(frozen=True)
class Revoked:
    principal: str
    generation: int


@dataclass(frozen=True)
class Warning:
    task: str
    class_: str
    count: int
    detail: str | None
    first_at: str
    last_at: str
    saturated: bool

    @staticmethod
    def from_json(d: dict[str, Any]) -> Warning:
        return Warning(
            task=str(d["task"]),
            class_=str(d["class"]),
            count=int(d["count"]),
            detail=d.get("detail"),
            first_at=str(d["first_at"]),
            last_at=str(d["last_at"]),
            saturated=bool(d["saturated"]),
        )


@dataclass(frozen=True)
class Record:
    """The record of ``get`` (SPEC §7). The most used fields are typed; the
    whole answer is in ``raw``."""

    key: str
    status: str
    rank: int
    reservation: dict[str, Any]
    lease: dict[str, Any] | None
    outcome: Outcome | None
    receipt: Receipt | None
    reconcile_required: bool
    disputed: bool
    attempts: list[dict[str, Any]]
    quarantine: list[dict[str, Any]]
    created_at: str
    updated_at: str
    expires_at: str | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Record:
        return Record(
            key=str(d["key"]),
            status=str(d["status"]),
            rank=int(d["rank"]),
            reservation=dict(d["reservation"]),
            lease=d.get("lease"),
            outcome=Outcome.from_json(d["outcome"]) if d.get("outcome") else None,
            receipt=Receipt.from_json(d["receipt"]) if d.get("receipt") else None,
            reconcile_required=bool(d["reconcile_required"]),
            disputed=bool(d["disputed"]),
            attempts=list(d.get("attempts") or []),
            quarantine=list(d.get("quarantine") or []),
            created_at=str(d["created_at"]),
            updated_at=str(d["updated_at"]),
            expires_at=d.get("expires_at"),
            raw=d,
        )


@dataclass(frozen=True)
class OperationSummary:
    """A record of ``list`` (SPEC §9). The whole answer is in ``raw``."""

    key: str
    status: str
    rank: int
    reconcile_required: bool
    disputed: bool
    stuck: bool
    quarantined: int
    lease: dict[str, Any] | None
    attempts: int
    created_at: str
    updated_at: str
    expires_at: str | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @staticmethod
    def from_json(d: dict[str, Any]) -> OperationSummary:
        return OperationSummary(
            key=str(d["key"]),
            status=str(d["status"]),
            rank=int(d["rank"]),
            reconcile_required=bool(d["reconcile_required"]),
            disputed=bool(d["disputed"]),
            stuck=bool(d.get("stuck", False)),
            quarantined=int(d.get("quarantined", 0)),
            lease=d.get("lease"),
            attempts=int(d.get("attempts", 0)),
            created_at=str(d["created_at"]),
            updated_at=str(d["updated_at"]),
            expires_at=d.get("expires_at"),
            raw=d,
        )


@dataclass(frozen=True)
class Page:
    """One page of ``list`` (SPEC §9): pass ``next`` as ``after`` (with the
    same filters and order) for the next page; None: the listing ended. A
    page may be shorter than ``limit`` while ``next`` is not None."""

    operations: list[OperationSummary]
    next: str | None

    @staticmethod
    def from_json(d: dict[str, Any]) -> Page:
        nxt = d.get("next")
        return Page([OperationSummary.from_json(o) for o in d.get("operations") or []], None if nxt is None else str(nxt))


@dataclass(frozen=True)
class Stats:
    """``GET /v1/stats`` (SPEC §9), for the caller's tenant."""

    by_status: dict[str, int]
    total: int
    reconcile_required: int
    disputed: int
    stuck: int
    quarantined: int
    quarantined_records: int
    refused: int
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @staticmethod
    def from_json(d: dict[str, Any]) -> Stats:
        return Stats(
            by_status={str(k): int(v) for k, v in dict(d.get("by_status") or {}).items()},
            total=int(d["total"]),
            reconcile_required=int(d["reconcile_required"]),
            disputed=int(d["disputed"]),
            stuck=int(d["stuck"]),
            quarantined=int(d["quarantined"]),
            quarantined_records=int(d["quarantined_records"]),
            refused=int(d["refused"]),
            raw=d,
        )


@dataclass(frozen=True)
class BatchResult:
    """One call's answer in a batch (SPEC §10): its HTTP ``status`` and
    ``body``, exactly what the single call would have answered (a refusal
    is a problem object)."""

    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return self.status == 200

    def error(self) -> ProblemError | None:
        """The typed error of a call that was not answered 200 (as the
        single call would have raised it), else None."""
        return None if self.ok else problem_error(self.status, self.body)
