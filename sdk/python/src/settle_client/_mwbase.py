"""What the three Idempotency-Key middlewares (ASGI, WSGI, Django) share
above the byte layouts of ``_mw``: the options and their validation, the
route policy, the one place the request fingerprint is computed, the
principal helpers, and the answers (problems, replays, 409 in progress) as
framework-free ``Answer`` values. The ASGI middleware drives these from
asyncio; ``_mwsync`` drives them from a thread for WSGI and Django.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypedDict, Union

from . import _mw
from .types import MAX_SAFE_INTEGER, Binding, InFlight, Outcome, Receipt, Replay
from .worker import hook_timeout_s

__all__ = [
    "Principal",
    "RoutePolicy",
    "Committed",
    "Resolution",
    "Answer",
    "Options",
    "MiddlewareOptions",
    "RETRYABLE",
    "check_generation",
    "principal_parts",
    "fixed_principal",
    "problem",
    "checked_finding",
    "committed_answer",
    "response_outcome",
    "stored_outcome",
    "statuses",
    "Release",
    "DEFAULT_LEDGER_DEADLINE_S",
    "replay_answer",
    "in_progress_answer",
    "not_sent_answer",
    "ledger_failure_answer",
    "target_of",
]

DEFAULT_LEDGER_DEADLINE_S = 2.0
"""How long the middleware retries a claim (and a dispatch) whose answer
was lost, or that got 503 or 429, before it answers 503."""


Principal = Union[str, tuple[str, int], None]
"""What a principal extractor returns: the caller's account (generation 0),
``(account, generation)``, or None when the request has no identity."""

RETRYABLE = "settle_retryable"
"""The flag ``mark_retryable`` sets on a request (its ASGI ``state``, its
WSGI environ, its Django request)."""


@dataclass(frozen=True)
class RoutePolicy:
    """How one route is wrapped. ``required``: a request without a key gets
    400 (else it runs unwrapped). ``fail_open``: when the ledger is
    unreachable (no answer, or a 503 ``unavailable``), run the handler
    without idempotency (logged) instead of 503; a refusal of the ledger
    never runs the handler. ``timeout``: seconds before the handler counts
    as failed (unknown; ASGI only: a thread cannot be interrupted).
    ``wait``: seconds a duplicate that finds the first request in progress
    waits for its outcome (claiming again after each retry hint) before it
    answers 409 ``request_in_progress``; None: the middleware's ``wait``
    (default 0). ``release_on``: the statuses that say nothing happened
    (not stored: released, the retry runs the handler); None: the
    middleware's ``release_on`` (default 408, 409, 425, 429)."""

    required: bool = True
    fail_open: bool = False
    timeout: float | None = None
    wait: float | None = None
    release_on: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Committed:
    """A reconcile hook's finding that the request's effect happened, with
    the response to store and replay (``status``, ``headers``, ``body``):
    settled as the handler's response would have been (``completed``, or
    ``failed`` for a 5xx; the ``stored_headers`` kept) and sent with
    ``Idempotent-Replayed: true``."""

    status: int
    headers: Sequence[tuple[str, str]] = ()
    body: bytes | str = b""


Resolution = Union[Committed, Literal["not_committed", "unavailable"]]
"""What a reconcile hook answers: ``Committed(...)`` (settle and replay
that response), ``"not_committed"`` (run the handler under the same fence)
or ``"unavailable"`` (cannot tell: 409 ``outcome_unknown``)."""


@dataclass(frozen=True)
class Answer:
    """A response the middleware makes itself (a problem, a replay, a hook's
    ``Committed``): status, headers (names lower case) and the whole body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def check_generation(generation: object) -> int:
    if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation <= MAX_SAFE_INTEGER:
        raise ValueError(f"a principal's generation must be an integer in [0, 2^53 - 1], got {generation!r}")
    return generation


def principal_parts(found: object) -> tuple[str, int] | None:
    """An extractor's answer as (principal, generation), None for none."""
    if found is None:
        return None
    if isinstance(found, str):
        return found, 0
    if isinstance(found, tuple) and len(found) == 2 and isinstance(found[0], str):
        return found[0], check_generation(found[1])
    raise TypeError(f"the principal extractor must return a str, (str, int) or None, not {found!r}")


def fixed_principal(name: str, generation: int = 0) -> Callable[[Any], Principal]:
    """The ``principal`` of an application with one caller: every request is
    ``name`` (at ``generation``). Works with every middleware (it ignores
    the request)."""
    if not isinstance(name, str):
        raise TypeError("fixed_principal: the name must be a str")
    check_generation(generation)
    fixed: Principal = (name, generation)

    def extract(request: Any) -> Principal:
        return fixed

    return extract


def problem(status: int, code: str, detail: str, extra: Sequence[tuple[str, str]] = ()) -> Answer:
    body = _mw.problem_body(status, code, detail)
    headers = [("content-type", "application/problem+json"), ("content-length", str(len(body)))]
    return Answer(status, headers + list(extra), body)


def _replay(status: int, stored_headers: Sequence[tuple[str, str]], body: bytes) -> Answer:
    headers = list(stored_headers) + [("content-length", str(len(body))), ("idempotent-replayed", "true")]
    return Answer(status, headers, body)


def target_of(path: str, query: str) -> str:
    """The fingerprint's request target: the path as sent plus ``?query``
    when the query is not empty (sdk/MIDDLEWARE-KEYS.md)."""
    return path + ("?" + query if query else "")


ReplayResponseHook = Callable[[Committed, Receipt], Any]
"""A middleware's ``on_replay`` option: called on every replay of a stored
response (the request's key was answered before, the handler does not
run) with that response as a ``Committed`` (``status``, ``headers``: the
stored ones, ``body``: bytes) and the record's ``Receipt``; it returns the
``Committed`` to send instead (``dataclasses.replace`` of the one given, or
a new one), with ``Idempotent-Replayed: true``. ASGI: it may be an ``async
def``. What it raises goes to the framework as a handler's error would (a
500); the record is not touched."""


class MiddlewareOptions(TypedDict, total=False):
    """The options every middleware takes besides ``client``,
    ``principal`` and ``reconcile`` (keyword arguments of the ASGI and WSGI
    middlewares, keys of Django's ``SETTLE_IDEMPOTENCY``); see
    ``Options.make`` for the defaults."""

    namespace: str
    methods: Sequence[str]
    routes: Callable[[str, str], RoutePolicy | None] | None
    stored_headers: Sequence[str]
    fingerprint_headers: Sequence[str]
    canonical_json: bool
    fields: Sequence[str] | None
    exclude: Sequence[str] | None
    max_stored_body: int
    max_request_body: int
    lease_ms: int
    retention_s: int | None
    timeout: float | None
    fail_open: bool
    unavailable_retry_after_s: int
    wait: float
    release_on: Sequence[int]
    ledger_deadline: float
    hook_timeout: float | None
    on_replay: ReplayResponseHook | None


@dataclass(frozen=True)
class Options:
    """The middleware options SPEC §8 names, validated once; every
    middleware reads them from here (see sdk/python/README.md)."""

    namespace: str
    methods: tuple[str, ...]
    routes: Callable[[str, str], RoutePolicy | None] | None
    stored_headers: tuple[str, ...]
    fingerprint_headers: tuple[str, ...]
    fingerprint_options: _mw.FingerprintOptions
    max_stored_body: int
    max_request_body: int
    lease_ms: int
    retention_s: int | None
    default_policy: RoutePolicy
    unavailable_retry_after_s: int
    ledger_deadline: float
    hook_timeout: float
    on_replay: ReplayResponseHook | None = None

    @classmethod
    def make(
        cls,
        *,
        middleware: str,
        principal: object,
        namespace: str = "default",
        methods: Sequence[str] = ("POST", "PATCH"),
        routes: Callable[[str, str], RoutePolicy | None] | None = None,
        stored_headers: Sequence[str] = (),
        fingerprint_headers: Sequence[str] = (),
        canonical_json: bool = True,
        fields: Sequence[str] | None = None,
        exclude: Sequence[str] | None = None,
        max_stored_body: int = _mw.DEFAULT_MAX_STORED_BODY,
        max_request_body: int = 1024 * 1024,
        lease_ms: int = 30000,
        retention_s: int | None = None,
        timeout: float | None = None,
        fail_open: bool = False,
        unavailable_retry_after_s: int = 1,
        wait: float = 0.0,
        release_on: Sequence[int] = tuple(sorted(_mw.NOT_COMMITTED_STATUSES)),
        ledger_deadline: float = DEFAULT_LEDGER_DEADLINE_S,
        hook_timeout: float | None = None,
        on_replay: ReplayResponseHook | None = None,
    ) -> Options:
        if principal is None or not callable(principal):
            raise TypeError(
                f"{middleware} needs the principal option: a function of the request that names the "
                "caller's account (never a token), e.g. principal=fixed_principal(\"acct-1\") for an application "
                "with one caller, or principal=authenticated_principal() for request.user"
            )
        if wait < 0:
            raise ValueError("wait is a number of seconds, at least 0")
        if on_replay is not None and not callable(on_replay):
            raise TypeError(f"on_replay is a function (response, receipt) -> response, not {type(on_replay).__name__}")
        if isinstance(ledger_deadline, bool) or not isinstance(ledger_deadline, (int, float)) or ledger_deadline < 0:
            raise ValueError("ledger_deadline is a number of seconds, at least 0")
        return cls(
            namespace=namespace,
            methods=tuple(m.upper() for m in methods),
            routes=routes,
            stored_headers=tuple(
                dict.fromkeys(list(_mw.DEFAULT_STORED_HEADERS) + [h.lower() for h in stored_headers])
            ),
            fingerprint_headers=tuple(h.lower() for h in fingerprint_headers),
            # Checked once here: a bad combination raises _mw.ConfigError (a
            # ValueError) naming the option.
            fingerprint_options=_mw.fingerprint_options(canonical_json, fields, exclude),
            max_stored_body=max_stored_body,
            max_request_body=max_request_body,
            lease_ms=lease_ms,
            retention_s=retention_s,
            default_policy=RoutePolicy(
                required=True, fail_open=fail_open, timeout=timeout, wait=wait, release_on=statuses(release_on)
            ),
            unavailable_retry_after_s=unavailable_retry_after_s,
            ledger_deadline=float(ledger_deadline),
            hook_timeout=hook_timeout_s(hook_timeout, lease_ms),
            on_replay=on_replay,
        )

    def policy(self, method: str, path: str) -> RoutePolicy | None:
        """The route's policy (``routes``, with the middleware's timeout and
        wait filled in), or None: the request is not wrapped."""
        if self.routes is not None:
            p = self.routes(method, path)
            if p is not None and p.timeout is None and self.default_policy.timeout is not None:
                p = replace(p, timeout=self.default_policy.timeout)
            if p is not None and p.wait is None:
                p = replace(p, wait=self.default_policy.wait)
            if p is not None and p.release_on is None:
                p = replace(p, release_on=self.default_policy.release_on)
            elif p is not None and p.release_on is not None:
                p = replace(p, release_on=statuses(p.release_on))
            return p
        return self.default_policy if method.upper() in self.methods else None

    def fingerprint(self, method: str, target: str, content_type: str, body: bytes, header: Callable[[str], str]) -> str:
        """The request's SPEC §8 fingerprint: the only call of
        ``_mw.request_fingerprint`` in the middlewares, so that a new
        fingerprint option is passed through here once. ``header(name)``:
        the request's header lines of that (lower-case) name joined by
        ", " ("" when absent)."""
        fp_headers = [(h, header(h)) for h in self.fingerprint_headers]
        return _mw.request_fingerprint(method, target, content_type, body, fp_headers, options=self.fingerprint_options)

    def ledger_key(self, principal: str, key: str) -> str:
        return _mw.ledger_key(self.namespace, principal, key)

    @staticmethod
    def binding(principal: str, generation: int) -> Binding:
        return Binding(_mw.binding_principal(principal), (), generation)

    def outcome(self, status: int, headers: Sequence[tuple[str, str]], body: bytes) -> Outcome:
        """The outcome a response is settled with: ``completed`` (``failed``
        for a 5xx), the stored headers, the body or, over
        ``max_stored_body``, its digest."""
        return stored_outcome(status, headers, body, self.stored_headers, self.max_stored_body)


def stored_outcome(
    status: int, headers: Sequence[tuple[str, str]], body: bytes, stored_headers: Sequence[str], max_stored_body: int
) -> Outcome:
    """A response as the middleware settles it (sdk/MIDDLEWARE-KEYS.md):
    ``completed`` (``failed`` for a 5xx), the stored headers, the body or,
    over ``max_stored_body``, its digest (a replay then answers 409
    ``response_not_stored``)."""
    result, digest = _mw.encode_response(status, headers, body, stored_headers, max_stored_body)
    return Outcome(status="failed" if status >= 500 else "completed", result=result, response_sha256=digest)


def statuses(values: Sequence[int]) -> tuple[int, ...]:
    """A ``release_on`` list, checked: HTTP statuses (100-599)."""
    if isinstance(values, (str, bytes)):
        raise TypeError("release_on is a list of HTTP statuses, e.g. (408, 409, 425, 429, 422)")
    out = tuple(dict.fromkeys(values))
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int) or not 100 <= v <= 599:
            raise ValueError(f"release_on holds HTTP statuses (100-599), not {v!r}")
    return out


@dataclass(frozen=True)
class Release:
    """A response that says nothing happened: released ``not_committed``,
    with ``forget`` (SPEC §4) for a status the application added to
    ``release_on`` beyond the default (408, 409, 425, 429), so that the
    corrected request with the same key runs."""

    forget: bool


def response_outcome(
    opts: Options,
    status: int,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    retryable: bool,
    release_on: Sequence[int] | None = None,
) -> Outcome | Release:
    """How a handler's response is recorded: a ``Release`` when it says
    nothing happened (a ``release_on`` status, default 408/409/425/429, or
    marked retryable), else its outcome."""
    listed = opts.default_policy.release_on if release_on is None else release_on
    assert listed is not None
    if status in listed:
        return Release(forget=status not in _mw.NOT_COMMITTED_STATUSES)
    if retryable:
        return Release(forget=False)
    return opts.outcome(status, headers, body)


def checked_finding(finding: object, key: str, log: logging.Logger) -> Resolution:
    """A reconcile hook's answer, anything unexpected taken as
    ``"unavailable"`` (logged)."""
    if isinstance(finding, Committed) or finding in ("not_committed", "unavailable"):
        return finding
    log.error(
        "idempotency: the reconcile hook answered %r for key %s (want Committed(...), "
        "\"not_committed\" or \"unavailable\"); taken as unavailable",
        finding,
        key,
    )
    return "unavailable"


def committed_answer(opts: Options, finding: Committed) -> tuple[Outcome, Answer]:
    """The outcome a hook's ``Committed`` is reconciled with, and the replay
    that is sent once it is (the stored headers only)."""
    headers = [(str(n), str(v)) for n, v in finding.headers]
    out = finding.body.encode("utf-8") if isinstance(finding.body, str) else bytes(finding.body)
    outcome = opts.outcome(finding.status, headers, out)
    stored = _mw.decode_response(outcome.result)
    return outcome, _replay(finding.status, stored.headers if stored is not None else [], out)


def replayed_response(dec: Replay) -> Committed | None:
    """The stored response of a replay, as the ``on_replay`` hook gets it
    (None when it was too large to store)."""
    stored = _mw.decode_response(dec.outcome.result)
    if stored is None or stored.body is None:
        return None
    return Committed(stored.status, tuple(stored.headers), stored.body)


def hooked_answer(found: object) -> Answer:
    """The replay of what ``on_replay`` returned (a ``Committed``)."""
    if not isinstance(found, Committed):
        raise TypeError(f"on_replay must return a settle_client.Committed, not {type(found).__name__}")
    body = found.body.encode("utf-8") if isinstance(found.body, str) else bytes(found.body)
    return _replay(found.status, [(n.lower(), v) for n, v in found.headers], body)


def replay_answer(dec: Replay) -> tuple[str, Answer]:
    """The answer to a claim that found the outcome stored, and its count
    name: the stored response, or 409 ``response_not_stored``."""
    stored = _mw.decode_response(dec.outcome.result)
    if stored is None or stored.body is None:
        return "response_not_stored", problem(
            409,
            "response_not_stored",
            "this request completed but its response was too large to store; it will not run again",
        )
    return "replayed", _replay(stored.status, stored.headers, stored.body)


NOT_SENT_DETAIL = "the request was not run to completion and nothing was done; retry it"


def not_sent_answer() -> Answer:
    """SPEC §8: the handler raised ``EffectNotSent`` (or ``EffectRefused``):
    released ``not_committed``; 503 ``idempotency_unavailable`` with
    ``Retry-After: 1``, the next retry runs the handler."""
    return problem(503, "idempotency_unavailable", NOT_SENT_DETAIL, [("retry-after", "1")])


def in_progress_answer(dec: InFlight) -> Answer:
    return problem(
        409,
        "request_in_progress",
        "a request with this Idempotency-Key is still being processed",
        [("retry-after", _mw.in_progress_retry_after(dec.retry_after_ms, dec.lease_expires_at))],
    )


OUTCOME_UNKNOWN_DETAIL = "an earlier request with this Idempotency-Key failed with an unknown outcome"
FAILED_DETAIL = "the request failed; its outcome is unknown and must be reconciled"
REUSED_DETAIL = "this Idempotency-Key was used for another request"
MISSING_DETAIL = "this route requires an Idempotency-Key header"
TOO_LARGE_DETAIL = "the request body is over the idempotency limit"


def ledger_failure_answer(f: _mw.LedgerFailure) -> Answer:
    extra = [("retry-after", str(f.retry_after))] if f.retry_after is not None else []
    return problem(f.status, f.code, f.detail, extra)
