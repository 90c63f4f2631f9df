"""The SPEC §8 flow for synchronous frameworks (WSGI, Django), on a sync
``Client``: one copy of the claim, in-progress wait, reconcile, dispatch,
heartbeat and settle steps that ``settle_client.wsgi`` and
``settle_client.django`` drive through a small adapter. It is the thread
twin of ``asgi.IdempotencyMiddleware``'s asyncio flow; what is decided
(policies, answers, outcomes, the fingerprint) comes from ``_mwbase`` for
all three.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from . import _mw
from ._mwbase import (
    FAILED_DETAIL,
    MISSING_DETAIL,
    OUTCOME_UNKNOWN_DETAIL,
    REUSED_DETAIL,
    TOO_LARGE_DETAIL,
    Answer,
    Committed,
    Options,
    Release,
    Resolution,
    RoutePolicy,
    checked_finding,
    committed_answer,
    in_progress_answer,
    ledger_failure_answer,
    hooked_answer,
    not_sent_answer,
    principal_parts,
    problem,
    replay_answer,
    replayed_response,
    response_outcome,
)
from .client import Client, new_claim_id
from .errors import (
    BindingMismatch,
    EffectNotSent,
    EffectRefused,
    FingerprintMismatch,
    InvalidRequest,
    ReceiptRequired,
    SettleError,
)
from .types import Binding, ClaimDecision, Grant, InFlight, Outcome, Receipt, Replay
from .worker import _Deadline, _Heartbeat, _in_flight_wait_s, _retry, call_hook_sync

R = TypeVar("R")


@dataclass(frozen=True)
class RequestInfo:
    """What the flow reads of a request. ``path``: for the route policy;
    ``target``: the path as sent plus ``?query`` (the fingerprint's);
    ``header(name)``: the values of a lower-case header name, one per
    line."""

    method: str
    path: str
    target: str
    header: Callable[[str], list[str]]

    def joined(self, name: str) -> str:
        return ", ".join(self.header(name))


@dataclass(frozen=True)
class Ran(Generic[R]):
    """A handler's complete response: what is settled (``status``,
    ``headers``, the whole ``body``, whether the handler marked it
    ``retryable``), and the framework's own response object to send."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    retryable: bool
    response: R


class HandlerFailed(Exception):
    """Raised by an adapter's ``execute`` when the handler failed (an
    exception the framework turned into a response, or no complete
    response): the outcome is unknown — unless ``raised``, the handler's
    exception when the framework reported it, is ``EffectNotSent`` or
    ``EffectRefused`` (nothing was done: released ``not_committed``)."""

    def __init__(self, message: str, raised: BaseException | None = None) -> None:
        super().__init__(message)
        self.raised = raised


@dataclass(frozen=True)
class Unwrapped:
    """Run the handler without idempotency (route not wrapped, no key on a
    route that does not require one, or fail-open). ``body``: the request
    body when it was already read (the adapter hands it back to the app)."""

    body: bytes | None


SyncReconcile = Callable[[str, int, bytes, str, str], object]
"""An adapter's reconcile hook: (ledger key, fence, body, Idempotency-Key,
principal) → the user hook's answer for the framework's request."""


class SyncFlow(Generic[R]):
    """SPEC §8 over a sync ``Client``. ``handle`` returns what to answer:
    an ``Answer`` the middleware made, ``Unwrapped`` (run the handler as if
    there were no middleware), or the handler's own response."""

    def __init__(self, client: Client, opts: Options, log: logging.Logger) -> None:
        self.client = client
        self.opts = opts
        self.log = log
        # Replays and refusals, by kind (SPEC §8: counted and logged).
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def count(self, what: str) -> None:
        with self._lock:  # a Counter's += is not atomic across threads
            self.counts[what] += 1

    def refuse(self, status: int, code: str, detail: str, key: str | None) -> Answer:
        self.count(code)
        self.log.info("idempotency: %s for key %s", code, key)
        return problem(status, code, detail)

    def handle(
        self,
        req: RequestInfo,
        principal: Callable[[], object],
        read_body: Callable[[int], tuple[bytes, bool]],
        execute: Callable[[bytes], Ran[R]],
        reconcile: SyncReconcile | None,
    ) -> Answer | Unwrapped | R:
        """``principal()``: the extractor's answer; ``read_body(limit)``:
        the whole body and whether it was over ``limit``; ``execute(body)``:
        runs the handler (raises when it failed); ``reconcile``: the
        application's hook for this request."""
        policy = self.opts.policy(req.method, req.path)
        if policy is None:
            return Unwrapped(None)
        try:
            key = _mw.parse_idempotency_key(req.header("idempotency-key"))
        except _mw.KeyError_ as e:
            return self.refuse(400, e.code, e.detail, None)
        if key is None:
            if not policy.required:
                return Unwrapped(None)
            return self.refuse(400, "idempotency_key_missing", MISSING_DETAIL, None)
        who = principal_parts(principal())
        if who is None:
            return self.refuse(401, "idempotency_principal_missing", _mw.PRINCIPAL_MISSING, key)
        body, too_large = read_body(self.opts.max_request_body)
        if too_large:
            return self.refuse(413, "payload_too_large", TOO_LARGE_DETAIL, key)
        ct = req.header("content-type")
        fp = self.opts.fingerprint(req.method, req.target, ct[0] if ct else "", body, req.joined)
        p, generation = who
        lkey = self.opts.ledger_key(p, key)
        binding = self.opts.binding(p, generation)
        call = _Call(self, policy, key, p, body, lkey, fp, binding, reconcile)
        return call.run(execute)


class _Call(Generic[R]):
    """One wrapped request through the ledger."""

    def __init__(
        self,
        flow: SyncFlow[R],
        policy: RoutePolicy,
        key: str,
        principal: str,
        body: bytes,
        lkey: str,
        fp: str,
        binding: Binding,
        reconcile: SyncReconcile | None,
    ) -> None:
        self.reconcile = reconcile
        self.flow = flow
        self.client = flow.client
        self.opts = flow.opts
        self.log = flow.log
        self.policy = policy
        self.key = key
        self.principal = principal
        self.body = body
        self.lkey = lkey
        self.fp = fp
        self.binding = binding

    def run(self, execute: Callable[[bytes], Ran[R]]) -> Answer | Unwrapped | R:
        # A duplicate that finds the first request in progress claims again
        # after each retry hint, up to the route's wait, then answers 409.
        waiting = _Deadline(self.policy.wait or 0.0)
        running: InFlight | None = None
        while True:
            dec = self.claim(running, waiting)
            if isinstance(dec, (Answer, Unwrapped)):
                return dec
            if not isinstance(dec, InFlight):
                break
            running = dec
            left = waiting.left()
            if left <= 0:
                return self.in_progress(dec)
            time.sleep(min(left, _in_flight_wait_s(dec.retry_after_ms)))

        if isinstance(dec, Replay):
            what, answer = replay_answer(dec)
            hook, stored = self.opts.on_replay, replayed_response(dec)
            if hook is not None and stored is not None:
                answer = hooked_answer(hook(stored, dec.receipt))
            self.flow.count(what)
            self.log.info("idempotency: %s for key %s", "replay" if what == "replayed" else what, self.key)
            return answer
        assert isinstance(dec, Grant)
        grant = dec
        if grant.decision == "reconcile":
            found = self.reconciled(grant)
            if isinstance(found, Answer):
                return found  # the hook's response was settled: replayed
            if found is None:
                return self.flow.refuse(409, "outcome_unknown", OUTCOME_UNKNOWN_DETAIL, self.key)
            grant = found
        # The dispatch is retried under the same fence while its answer is
        # lost (the ledger answers a repeated dispatch alike), within the
        # ledger deadline and half the lease: the rest is left for handing
        # the lease back.
        try:
            _retry(
                lambda: self.client.dispatch(self.lkey, grant.fence),
                _Deadline(min(self.opts.ledger_deadline, self.opts.lease_ms / 2000.0)),
                "dispatch",
            )
        except Exception as e:  # noqa: BLE001 - the handler has not run: hand the lease back, then classify
            if self.release_undispatched(grant.fence):
                return problem(500, "outcome_unknown", FAILED_DETAIL)
            return self.ledger_failed(e, "dispatch")
        return self.execute(execute, grant.fence)

    def cleanup_deadline(self) -> _Deadline:
        # Calls that record what happened are retried up to the lease's end.
        return _Deadline(self.opts.lease_ms / 1000.0)

    def in_progress(self, dec: InFlight) -> Answer:
        self.flow.count("request_in_progress")
        self.log.info("idempotency: key %s in progress", self.key)
        return in_progress_answer(dec)

    def claim(self, running: InFlight | None, waiting: _Deadline) -> ClaimDecision | Answer | Unwrapped:
        """The claim's decision, or the answer to a failure. A claim whose
        answer was lost (or a 503, a 429) is retried with the same
        ``claim_id`` within the ledger deadline; while waiting for a request
        known to be running (``running``), within what is left of the wait,
        and a claim that still fails answers 409 ``request_in_progress``
        (never fail open)."""
        cid = new_claim_id()
        bound = self.opts.ledger_deadline if running is None else max(0.0, waiting.left())
        try:
            return _retry(
                lambda: self.client.claim(
                    self.lkey,
                    self.fp,
                    self.binding,
                    lease_ms=self.opts.lease_ms,
                    worker=_mw.worker_label(self.key, self.principal),
                    marks_dispatch=True,
                    retention_s=self.opts.retention_s,
                    claim_id=cid,
                ),
                _Deadline(bound),
                "claim",
            )
        except (FingerprintMismatch, BindingMismatch):
            return self.flow.refuse(422, "idempotency_key_reused", REUSED_DETAIL, self.key)
        except Exception as e:  # noqa: BLE001 - every failure of the claim is classified; none runs the handler unless allowed
            if running is not None:
                self.log.warning(
                    "idempotency: the claim of key %s failed while it waited for the request in progress: %s", self.key, e
                )
                return self.in_progress(running)
            return self.ledger_failed(e, "claim")

    def ledger_failed(self, err: BaseException, call: str) -> Answer | Unwrapped:
        """A claim or dispatch that failed (SPEC §8): only a ledger that gave
        no answer or a 503 ``unavailable`` lets a fail-open route run the
        handler; a refusal never does."""
        f = _mw.classify_ledger_error(err, self.opts.unavailable_retry_after_s)
        if self.policy.fail_open and f.fail_open:
            self.flow.count("fail_open")
            self.log.warning(
                "idempotency: ledger unreachable (%s); key %s runs WITHOUT idempotency (fail_open)", err, self.key
            )
            return Unwrapped(self.body)
        self.flow.count(f.code)
        if f.unexpected:
            self.log.error(
                "idempotency: unexpected answer of the ledger to the %s of key %s: %r", call, self.key, err, exc_info=err
            )
        else:
            self.log.warning("idempotency: the %s of key %s failed (%s): %s", call, self.key, f.code, err)
        return ledger_failure_answer(f)

    def reconciled(self, grant: Grant) -> Grant | Answer | None:
        """Asks the hook about a record left ``unknown``: the execute grant
        under the same fence (``not_committed``), the replay of the hook's
        response (``Committed``, settled), or None (the lease was handed
        back: 409 ``outcome_unknown``). The reconcile lease is heartbeated
        while the hook runs (in a thread of its own), bounded by
        ``hook_timeout`` (past it the hook counts as ``unavailable``)."""
        finding: Resolution = "unavailable"
        hook = self.reconcile
        if hook is not None:
            hb = _Heartbeat(self.client, self.lkey, grant.fence, self.opts.lease_ms, threading.Event())
            try:
                found = call_hook_sync(
                    lambda: hook(self.lkey, grant.fence, self.body, self.key, self.principal), self.opts.hook_timeout
                )
                finding = checked_finding(found, self.key, self.log)
            except Exception:
                self.log.exception("idempotency: reconcile hook failed for key %s", self.key)
                finding = "unavailable"
            finally:
                hb.stop()
        lease = self.cleanup_deadline()
        try:
            if isinstance(finding, Committed):
                outcome, answer = committed_answer(self.opts, finding)
                ans = _retry(
                    lambda: self.client.reconcile(
                        self.lkey, grant.fence, "committed", fingerprint=self.fp, binding=self.binding, outcome=outcome
                    ),
                    lease,
                    "reconcile",
                )
                if isinstance(ans, Receipt):
                    self.flow.count("reconciled")
                    self.log.info("idempotency: key %s reconciled as committed (%d); replayed", self.key, finding.status)
                    return answer
            elif finding == "not_committed":
                ans = _retry(lambda: self.client.reconcile(self.lkey, grant.fence, "not_committed"), lease, "reconcile")
                if isinstance(ans, Grant):
                    self.log.info("idempotency: key %s reconciled as not committed; the handler runs again", self.key)
                    return ans
            else:
                _retry(lambda: self.client.reconcile(self.lkey, grant.fence, "unavailable"), lease, "reconcile")
        except SettleError:
            self.log.warning("idempotency: reconcile of key %s failed", self.key, exc_info=True)
        return None

    def execute(self, execute: Callable[[bytes], Ran[R]], fence: int) -> Answer | R:
        self.flow.count("executed")
        hb = _Heartbeat(self.client, self.lkey, fence, self.opts.lease_ms, threading.Event())
        try:
            ran = execute(self.body)
        except BaseException as e:  # noqa: BLE001 - every escape is an unknown outcome
            hb.stop()
            said = e.raised if isinstance(e, HandlerFailed) else e
            if isinstance(said, (EffectNotSent, EffectRefused)):
                # The handler's own word: nothing was done (SPEC §8).
                self.log.info(
                    "idempotency: the handler of key %s raised %s: released not_committed", self.key, type(said).__name__
                )
                self.release_not_committed(fence)
                return not_sent_answer()
            self.settle_unknown(fence, type(e).__name__)
            if not isinstance(e, Exception):
                raise  # KeyboardInterrupt, SystemExit: the process is going; the record is settled
            if not isinstance(e, HandlerFailed):
                # A WSGI server never sees it (the 500 below is an answer):
                # logged here, as the server would have.
                self.log.error("idempotency: the handler of key %s raised", self.key, exc_info=e)
            return problem(500, "outcome_unknown", FAILED_DETAIL)
        hb.stop()
        outcome = response_outcome(self.opts, ran.status, ran.headers, ran.body, ran.retryable, self.policy.release_on)
        if isinstance(outcome, Release):
            self.release_not_committed(fence, forget=outcome.forget)
        else:
            try:
                _retry(
                    lambda: self.client.settle(self.lkey, fence, self.fp, self.binding, outcome),
                    self.cleanup_deadline(),
                    "settle",
                )
            except SettleError:
                # The response goes out anyway (the effect happened); the
                # record becomes unknown when its lease lapses.
                self.log.error("idempotency: the response of key %s could not be settled", self.key, exc_info=True)
        return ran.response

    def release_undispatched(self, fence: int) -> bool:
        """Hands back a lease whose handler never ran after a dispatch that
        failed: ``release(not_dispatched)``, and the ledger decides (SPEC
        §11.11: the SDK never attests on its own inference). When it had
        recorded the dispatch after all (``receipt_required``), the record
        is settled ``unknown`` and True is returned (500
        ``outcome_unknown``)."""
        try:
            _retry(lambda: self.client.release(self.lkey, fence, "not_dispatched"), self.cleanup_deadline(), "release")
            return False
        except ReceiptRequired:
            self.settle_unknown(fence, "the dispatch was recorded but its answer was lost")
            return True
        except Exception:  # noqa: BLE001 - the lease lapses (unknown if the dispatch was recorded)
            self.log.warning("idempotency: release(not_dispatched) of key %s failed", self.key, exc_info=True)
            return False

    def release_not_committed(self, fence: int, forget: bool = False) -> None:
        self.flow.count("not_committed")
        deadline = self.cleanup_deadline()
        try:
            if forget:
                try:
                    _retry(lambda: self.client.release(self.lkey, fence, "not_committed", forget=True), deadline, "release")
                    return
                except (ReceiptRequired, InvalidRequest) as e:
                    # Something was recorded on this key before (or a server
                    # without forget): keep the record, release it.
                    self.log.info("idempotency: key %s cannot be forgotten (%s); released not_committed", self.key, e.code)
            _retry(lambda: self.client.release(self.lkey, fence, "not_committed"), deadline, "release")
        except InvalidRequest:
            # A server without release(not_committed) (SPEC §4): the safe
            # record is unknown.
            self.log.warning(
                "idempotency: the ledger refused release(not_committed) for key %s; settling unknown", self.key
            )
            self.settle_unknown(fence, "not_committed unsupported")
        except SettleError:
            self.log.error("idempotency: release of key %s failed", self.key, exc_info=True)

    def settle_unknown(self, fence: int, why: str) -> None:
        self.flow.count("outcome_unknown")
        self.log.warning("idempotency: key %s failed (%s); outcome unknown", self.key, why)
        try:
            _retry(
                lambda: self.client.settle(
                    self.lkey, fence, self.fp, self.binding, Outcome(status="unknown", error=f"handler failed: {why}"[:4096])
                ),
                self.cleanup_deadline(),
                "settle",
            )
        except SettleError:
            # The lease lapses after dispatch: the ledger marks it unknown anyway.
            self.log.error("idempotency: settle unknown of key %s failed", self.key, exc_info=True)
