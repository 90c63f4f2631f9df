"""The fault table as data (sdk/fault-vectors.json, sdk/FAULT-VECTORS.md):
every scenario, through every way the Python SDK offers, against
settle-faultproxy in front of a real ``settle serve``.

- ``run_once`` scenarios: ``run_once`` (a ``Client``), ``run_once_async``
  (an ``AsyncClient``), ``@idempotent`` on a function and on an ``async
  def``;
- ``middleware`` scenarios: the ASGI middleware (a Starlette app through
  httpx's ASGITransport) and the WSGI middleware (a bare WSGI app through
  httpx's WSGITransport);
- ``reconciler`` and ``reconciler_lifecycle`` scenarios: ``Reconciler`` and
  ``AsyncReconciler``.

One case per (scenario, variant). A scenario a variant cannot run fails
(an unknown subject, step, finding or expectation is an error here, never a
skip). The whole file is skipped only with ``SETTLE_TEST_LEDGER=local``
(there is no network between the SDK and an in-process ledger to break).

How each language-neutral result kind is read here (``result_kinds``):
``ok`` the run returned; ``not_sent`` ``EffectNotSent``, or the effect's own
exception re-raised as it is (SPEC §11.8: Python re-raises a failure before
the dispatch mark under ``marks_dispatch`` unchanged); ``effect_refused``
``EffectRefused``; ``refused:<code>`` the ``Refusal`` subclass of that code;
``outcome_unknown`` ``OutcomeUnknown``; ``deadline`` ``DeadlineExceeded``;
``reconcile_required`` ``ReconcileRequired``. ``cause: deadline``: the
error's ``__cause__`` is a ``DeadlineExceeded``.

``next_request``: the same request again (with ``request_body`` as its
JSON body when given), no faults, its handler running ``write``,
``respond:201``; ``body`` is the response's expected JSON body.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from conftest import LOCAL, REPO, start_server, stop
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import settle_client
from settle_client import (
    AsyncClient,
    AsyncReconciler,
    Binding,
    Client,
    Committed,
    DeadlineExceeded,
    Done,
    EffectNotSent,
    EffectRefused,
    InvalidRequest,
    MiddlewareHook,
    MiddlewareRecord,
    NotFound,
    Outcome,
    OutcomeUnknown,
    PayloadTooLarge,
    ReconcileRequired,
    Reconciler,
    Refusal,
    fingerprint,
    fixed_principal,
    idempotent,
    run_once,
    run_once_async,
)
from settle_client import _mw
from settle_client.asgi import IdempotencyMiddleware as AsgiIdempotency
from settle_client.asgi import ReconcileRequest as AsgiRequest
from settle_client.wsgi import IdempotencyMiddleware as WsgiIdempotency
from settle_client.wsgi import ReconcileRequest as WsgiRequest

if LOCAL:
    pytest.skip(
        "local ledger mode: the fault vectors need a network between the SDK and settle (settle-faultproxy)",
        allow_module_level=True,
    )

VECTORS: dict[str, Any] = json.loads((REPO / "sdk" / "fault-vectors.json").read_text(encoding="utf-8"))
DEFAULTS: dict[str, Any] = VECTORS["defaults"]
SCENARIOS: list[dict[str, Any]] = VECTORS["scenarios"]
RUN = uuid.uuid4().hex[:8]
NAMESPACE = "fv"
WAIT_S = 10.0  # the most any event of a case is waited for (a failure, never a normal path)

VARIANTS: dict[str, tuple[str, ...]] = {
    "run_once": ("run_once", "run_once_async", "idempotent", "idempotent_async"),
    "middleware": ("asgi", "wsgi"),
    "reconciler": ("reconciler", "async_reconciler"),
    "reconciler_lifecycle": ("reconciler", "async_reconciler"),
}


def _cases() -> Iterator[Any]:
    for sc in SCENARIOS:
        # An unknown subject still makes a case: it fails (never skipped).
        for variant in VARIANTS.get(sc["subject"], ("unknown-subject",)):
            yield pytest.param(sc, variant, id=f"{sc['id']}-{variant}")


# ------------------------------------------------------------------ processes


def _proxy_bin() -> str:
    b = os.environ.get("SETTLE_FAULTPROXY_BIN") or str(REPO / "target" / "debug" / "settle-faultproxy")
    if not Path(b).exists():
        pytest.fail(
            f"settle-faultproxy not found at {b}: build it (cargo build -p settle-faultproxy) or set "
            "SETTLE_FAULTPROXY_BIN (sdk/test.sh does)",
            pytrace=False,
        )
    return b


@dataclass
class Ledger:
    """A settle server and the fault proxy in front of it; ``direct``: a
    client of the server itself (not through the proxy)."""

    server_url: str
    proxy_url: str
    procs: list[subprocess.Popen[str]]
    control: httpx.Client = field(init=False)
    direct: Client = field(init=False)

    def __post_init__(self) -> None:
        self.control = httpx.Client(base_url=self.proxy_url, timeout=10)
        self.direct = Client(self.server_url)

    def rules(self, rules: list[dict[str, Any]]) -> None:
        r = self.control.put("/__faults/rules", json={"rules": rules})
        assert r.status_code == 200, r.text

    def clear(self) -> None:
        r = self.control.delete("/__faults/rules")
        assert r.status_code == 200, r.text

    def log(self) -> list[dict[str, Any]]:
        r = self.control.get("/__faults/log")
        assert r.status_code == 200, r.text
        calls: list[dict[str, Any]] = r.json()["calls"]
        return calls


def start_ledger(data: Path) -> Ledger:
    proxy_bin = _proxy_bin()
    s = start_server(data, extra=["--segment-bytes", "1048576"])
    assert s.proc is not None
    upstream = s.url.removeprefix("http://")
    env = dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "warn"))
    p = subprocess.Popen(
        [proxy_bin, "--listen", "127.0.0.1:0", "--upstream", upstream],
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        env=env,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        p.kill()
        stop(s.proc)
        raise RuntimeError(f"settle-faultproxy did not start: {line!r}")
    return Ledger(s.url, "http://" + line.split()[-1], [p, s.proc])


def stop_ledger(led: Ledger) -> None:
    led.control.close()
    led.direct.close()
    for p in led.procs:
        stop(p)


@pytest.fixture(scope="module")
def shared_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    led = start_ledger(tmp_path_factory.mktemp("fault-vectors"))
    yield led
    stop_ledger(led)


# ------------------------------------------------------------------ a case


@dataclass
class Case:
    """One (scenario, variant): names, options, counters and the ledger."""

    sc: dict[str, Any]
    variant: str
    led: Ledger
    key: str = ""
    opts: dict[str, Any] = field(default_factory=dict)
    mw: dict[str, Any] = field(default_factory=dict)
    effect_calls: int = 0
    handler_calls: int = 0
    remote_writes: int = 0
    hook_saw: dict[str, Any] | None = None
    release: threading.Event = field(default_factory=threading.Event)
    hook_started: threading.Event = field(default_factory=threading.Event)
    # The same, for an async hook: made in the event loop that waits on it.
    ahook_started: asyncio.Event | None = None
    counting: bool = True
    on_replay_calls: int = 0
    on_replay_calls_first: int | None = None  # after the first request (middleware)

    def started(self) -> None:
        self.hook_started.set()
        if self.ahook_started is not None:
            self.ahook_started.set()

    def __post_init__(self) -> None:
        self.key = f"fv-{RUN}-{self.variant}-{self.sc['id']}~"
        self.opts = {**{k: v for k, v in DEFAULTS.items() if k != "mw"}, **self.sc.get("options", {})}
        self.mw = {**DEFAULTS["mw"], **{k: v for k, v in self.sc.get("options", {}).items() if k in DEFAULTS["mw"]}}

    @property
    def principal(self) -> str:
        return self.key

    def sub(self, s: str) -> str:
        return s.replace("$key", self.key).replace("$principal", self.principal)

    def key_of(self, suffix: str | None = None) -> str:
        return self.key if suffix is None else f"{self.key}:{suffix}"

    @property
    def ledger_key(self) -> str:
        return _mw.ledger_key(NAMESPACE, self.principal, self.key)

    @property
    def fp(self) -> str:
        return fingerprint(self.opts["request"])

    @property
    def binding(self) -> Binding:
        return Binding(self.principal, tuple(self.opts["scopes"]), 0)

    @property
    def deadline(self) -> float:
        return float(self.opts["deadline_ms"]) / 1000.0

    @property
    def hook_timeout(self) -> float | None:
        ms = self.opts.get("hook_timeout_ms")
        return None if ms is None else float(ms) / 1000.0

    def setup_unknown(self, suffix: str | None = None) -> None:
        key = self.key_of(suffix)
        c = self.led.direct
        g = c.claim(key, self.fp, self.binding)
        assert isinstance(g, settle_client.Grant) and g.decision == "execute", g
        c.settle(key, g.fence, self.fp, self.binding, Outcome(status="unknown", error="fault-vectors setup"))

    def setup_completed(self) -> None:
        c = self.led.direct
        g = c.claim(self.key, self.fp, self.binding)
        assert isinstance(g, settle_client.Grant) and g.decision == "execute", g
        c.settle(self.key, g.fence, self.fp, self.binding, Done({"ok": True}).outcome())

    def set_faults(self, keys: Iterable[str]) -> None:
        """The scenario's faults, each limited to the scenario's key (so
        that nothing else the proxy sees can move its count)."""
        only = list(keys)
        rules = []
        for f in self.sc.get("faults", []):
            r = dict(f)
            if len(only) == 1 and r["call"] not in ("list", "principal"):
                r["key"] = only[0]
            rules.append(r)
        self.led.rules(rules)


def _expect_keys(expect: dict[str, Any], known: set[str]) -> None:
    unknown = set(expect) - known
    assert not unknown, f"expectations this runner does not know: {sorted(unknown)}"


def check_calls(case: Case, keys: set[str], log: list[dict[str, Any]]) -> None:
    want = case.sc["expect"].get("calls")
    if want is None:
        return
    got = {name: sum(1 for c in log if c["call"] == name and c.get("key") in keys) for name in want}
    assert got == want, f"calls seen by the proxy: {got}, expected {want}; log {log}"


def check_record(case: Case, key: str, want: dict[str, Any]) -> None:
    _expect_keys(want, {"exists", "status", "reconcile_required", "attempts", "quarantined", "dispatched", "worker", "lease"})
    try:
        rec = case.led.direct.get(key)
    except NotFound:
        assert want.get("exists", True) is False, f"record {key} does not exist; expected {want}"
        return
    assert want.get("exists", True), f"record {key} exists ({rec.status}); expected none"
    got: dict[str, Any] = {}
    for name in want:
        if name == "exists":
            got[name] = True
        elif name == "status":
            got[name] = "pending" if rec.status in ("pending", "running") else rec.status
        elif name == "reconcile_required":
            got[name] = rec.reconcile_required
        elif name == "attempts":
            got[name] = rec.raw["attempts_total"]
        elif name == "quarantined":
            got[name] = rec.raw["quarantine_total"]
        elif name == "dispatched":
            got[name] = None if rec.lease is None else rec.lease["dispatched"]
        elif name == "worker":
            got[name] = rec.attempts[0]["lease"]["worker"]
        elif name == "lease":
            lease = rec.lease
            if lease is None:
                got[name] = None
            elif lease["ended"] is None:
                got[name] = "open"
            else:
                got[name] = "ended:" + str(lease["ended"]["reason"])
    expected = {k: case.sub(v) if isinstance(v, str) else v for k, v in want.items()}
    assert got == expected, f"record {key}: {got}, expected {expected}; {json.dumps(rec.raw)[:3000]}"


def check_records(case: Case, single_key: str) -> None:
    exp = case.sc["expect"]
    if "record" in exp:
        check_record(case, single_key, exp["record"])
    for suffix, want in exp.get("records", {}).items():
        check_record(case, case.key_of(suffix), want)


def check_next_claim(case: Case) -> None:
    want = case.sc["expect"].get("next_claim")
    if want is None:
        return
    dec = case.led.direct.claim(case.key, case.fp, case.binding, marks_dispatch=bool(case.opts["marks_dispatch"]))
    assert dec.decision == want, f"the next claim got {dec}, expected {want}"


# ------------------------------------------------------------------ run_once


class _Other(Exception):
    """The effect's ordinary failure (``raise_other``)."""


def result_kind(exc: BaseException | None, own: set[int]) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, OutcomeUnknown):
        return "outcome_unknown"
    if isinstance(exc, ReconcileRequired):
        return "reconcile_required"
    if isinstance(exc, EffectNotSent):
        return "not_sent"
    if isinstance(exc, EffectRefused):
        return "effect_refused"
    if isinstance(exc, Refusal):
        return f"refused:{exc.code}"
    if isinstance(exc, DeadlineExceeded):
        return "deadline"
    if id(exc) in own:
        return "not_sent"  # the effect's own failure, re-raised as it was (SPEC §11.8)
    return f"unexpected {type(exc).__name__}: {exc}"


class Effect:
    """The scenario's ``effect`` steps for one variant."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.steps: list[str] = list(case.sc.get("effect", []))
        self.raised: set[int] = set()
        known = {"dispatch", "dispatch_ignore_error", "write", "revoke", "wait_lease_lost"}
        ends = {"complete", "complete_large", "raise_not_sent", "raise_refused", "raise_other"}
        assert self.steps and self.steps[-1] in ends and set(self.steps[:-1]) <= known, f"effect steps {self.steps}"

    def _end(self) -> Any:
        last = self.steps[-1]
        if last == "complete":
            return {"ok": True}
        if last == "complete_large":
            return {"pad": "x" * int(self.case.opts["large_result_bytes"])}
        exc: BaseException = {
            "raise_not_sent": EffectNotSent("fault-vectors: nothing was sent"),
            "raise_refused": EffectRefused("fault-vectors: the remote refused it"),
            "raise_other": _Other("fault-vectors: the effect failed"),
        }[last]
        self.raised.add(id(exc))
        raise exc

    def _revoke(self) -> None:
        self.case.led.direct.revoke(self.case.principal)

    def run_sync(self, dispatch: Callable[[], None], lease_lost: Callable[[], threading.Event]) -> Any:
        self.case.effect_calls += 1
        for step in self.steps[:-1]:
            if step == "dispatch":
                self._guard(dispatch)
            elif step == "dispatch_ignore_error":
                try:
                    dispatch()
                except Exception:  # noqa: BLE001 - the scenario's effect swallows it (issue 47 defect 1)
                    pass
            elif step == "write":
                self.case.remote_writes += 1
            elif step == "revoke":
                self._revoke()
            elif step == "wait_lease_lost":
                assert lease_lost().wait(WAIT_S), "the context never said the lease was lost"
        return self._end()

    async def run_async(self, dispatch: Callable[[], Awaitable[None]], lease_lost: Callable[[], asyncio.Event]) -> Any:
        self.case.effect_calls += 1
        for step in self.steps[:-1]:
            if step == "dispatch":
                try:
                    await dispatch()
                except BaseException as e:
                    self.raised.add(id(e))
                    raise
            elif step == "dispatch_ignore_error":
                try:
                    await dispatch()
                except Exception:  # noqa: BLE001
                    pass
            elif step == "write":
                self.case.remote_writes += 1
            elif step == "revoke":
                self._revoke()
            elif step == "wait_lease_lost":
                await asyncio.wait_for(lease_lost().wait(), WAIT_S)
        return self._end()

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as e:
            self.raised.add(id(e))
            raise


def run_once_hook(case: Case, is_async: bool) -> Any:
    hook = case.sc.get("hook")
    if hook is None:
        return None
    finding = hook["finding"]
    assert finding in ("committed", "not_committed", "unavailable", "raise", "hang"), f"hook finding {finding}"
    sleep = float(hook.get("sleep_ms", 0)) / 1000.0

    def answer() -> Any:
        if finding == "committed":
            return Done({"ok": True})
        if finding == "raise":
            raise RuntimeError("fault-vectors: the hook failed")
        return finding

    if is_async:

        async def ahook(key: str, fence: int) -> Any:
            case.started()
            if sleep:
                await asyncio.sleep(sleep)
            if finding == "hang":
                await asyncio.Event().wait()  # never set: cancelled at hook_timeout
            return answer()

        return ahook

    def shook(key: str, fence: int) -> Any:
        case.started()
        if sleep:
            time.sleep(sleep)
        if finding == "hang":
            # "Never" returns: released when the case ends. A hook that was not
            # abandoned at hook_timeout would then commit, and the case fail.
            case.release.wait(30)
            return Done({"ok": True})
        return answer()

    return shook


def run_once_replay_hook(case: Case, is_async: bool) -> Any:
    """``on_replay: true``: counts its calls; the stored result, wrapped."""
    if not case.sc.get("on_replay"):
        return None

    def answer(outcome: Outcome, receipt: settle_client.Receipt) -> Any:
        assert receipt.key == case.key and receipt.status == outcome.status, (receipt, outcome)
        case.on_replay_calls += 1
        return {"replayed_by_hook": outcome.result}

    if is_async:

        async def ahook(outcome: Outcome, receipt: settle_client.Receipt) -> Any:
            await asyncio.sleep(0)
            return answer(outcome, receipt)

        return ahook
    return answer


def mw_replay_hook(case: Case, is_async: bool) -> Any:
    """``on_replay: true`` for a middleware: the stored status, a body of our own."""
    if not case.sc.get("on_replay"):
        return None

    def answer(response: Committed, receipt: settle_client.Receipt) -> Committed:
        assert receipt.key == case.ledger_key, receipt
        case.on_replay_calls += 1
        body = json.dumps({"replayed_by_hook": True, "status": response.status}).encode()
        return Committed(response.status, [("content-type", "application/json")], body)

    if is_async:

        async def ahook(response: Committed, receipt: settle_client.Receipt) -> Committed:
            await asyncio.sleep(0)
            return answer(response, receipt)

        return ahook
    return answer


def check_replay(case: Case, run: tuple[bool, Any] | None) -> None:
    exp = case.sc["expect"]
    replayed, value = run if run is not None else (None, None)
    if "replayed" in exp:
        assert replayed == exp["replayed"], f"replayed={replayed}, expected {exp['replayed']}"
    if "value" in exp:
        assert value == exp["value"], f"value {value!r}, expected {exp['value']!r}"
    if "on_replay_calls" in exp:
        assert case.on_replay_calls == exp["on_replay_calls"], f"on_replay called {case.on_replay_calls} times"


def check_carried(case: Case, exc: BaseException | None, effect: Effect) -> None:
    """What an ``OutcomeUnknown`` carries, by the scenario's row (§11.11):
    the effect's error, the refusal, the outcome that could not be
    recorded, the hook's failure."""
    if not isinstance(exc, OutcomeUnknown):
        return
    row, cause = case.sc["row"], exc.__cause__
    if row == "effect-failed":
        assert cause is not None and id(cause) in effect.raised, f"{exc!r} is caused by {cause!r}"
    elif row == "settle-refused":
        assert isinstance(cause, (InvalidRequest, PayloadTooLarge)), f"{exc!r} is caused by {cause!r}"
        assert exc.outcome is not None and exc.receipt is not None and exc.receipt.status == "unknown"
    elif row == "settle-deadline":
        assert isinstance(cause, DeadlineExceeded) and exc.outcome is not None, (exc, cause, exc.outcome)
        assert exc.outcome.result == {"ok": True}
    elif row == "hook-failed":
        assert isinstance(cause, (RuntimeError, TimeoutError)), f"{exc!r} is caused by {cause!r}"


def run_run_once(case: Case) -> None:
    _expect_keys(
        case.sc["expect"],
        {"result", "cause", "effect_calls", "remote_writes", "calls", "record", "next_claim", "replayed", "value",
         "on_replay_calls"},
    )
    for s in case.sc.get("setup", []):
        assert s in ("unknown_record", "completed_record"), f"setup {s}"
        if s == "unknown_record":
            case.setup_unknown()
        else:
            case.setup_completed()
    case.set_faults([case.key])
    effect = Effect(case)
    v = case.variant
    common: dict[str, Any] = dict(
        principal=case.principal,
        scopes=case.opts["scopes"],
        lease_ms=int(case.opts["lease_ms"]),
        deadline=case.deadline,
        marks_dispatch=bool(case.opts["marks_dispatch"]),
        hook_timeout=case.hook_timeout,
    )
    exc: BaseException | None = None
    got: list[tuple[bool, Any]] = []  # (replayed, value) of the run
    try:
        if v == "run_once":
            with Client(case.led.proxy_url) as c:
                r = run_once(
                    c,
                    case.key,
                    case.opts["request"],
                    lambda ctx: Done(effect.run_sync(ctx.dispatch, lambda: ctx.lease_lost)),
                    reconcile=run_once_hook(case, False),
                    on_replay=run_once_replay_hook(case, False),
                    **common,
                )
                got.append((r.replayed, r.value))
        elif v == "run_once_async":

            async def main() -> None:
                async with AsyncClient(case.led.proxy_url) as c:

                    async def eff(ctx: settle_client.AsyncEffectContext) -> Done:
                        return Done(await effect.run_async(ctx.dispatch, lambda: ctx.lease_lost))

                    r = await run_once_async(
                        c,
                        case.key,
                        case.opts["request"],
                        eff,
                        reconcile=run_once_hook(case, True),
                        on_replay=run_once_replay_hook(case, True),
                        **common,
                    )
                    got.append((r.replayed, r.value))

            asyncio.run(main())
        elif v == "idempotent":
            with Client(case.led.proxy_url) as c:

                def lost() -> threading.Event:
                    ctx = settle_client.effect_context()
                    assert isinstance(ctx, settle_client.EffectContext)
                    return ctx.lease_lost

                def mark() -> None:
                    settle_client.dispatch()

                @idempotent(
                    c,
                    key=lambda req: case.key,
                    reconcile=run_once_hook(case, False),
                    on_replay=run_once_replay_hook(case, False),
                    **common,
                )
                def charge(req: dict[str, Any]) -> Any:
                    return effect.run_sync(mark, lost)

                inv = charge.invoke(case.opts["request"])
                got.append((inv.replayed, inv.value))
        elif v == "idempotent_async":

            async def amain() -> None:
                async with AsyncClient(case.led.proxy_url) as c:

                    def alost() -> asyncio.Event:
                        ctx = settle_client.effect_context()
                        assert isinstance(ctx, settle_client.AsyncEffectContext)
                        return ctx.lease_lost

                    @idempotent(
                        c,
                        key=lambda req: case.key,
                        reconcile=run_once_hook(case, True),
                        on_replay=run_once_replay_hook(case, True),
                        **common,
                    )
                    async def charge(req: dict[str, Any]) -> Any:
                        return await effect.run_async(settle_client.dispatch, alost)

                    inv = await charge.invoke(case.opts["request"])
                    got.append((inv.replayed, inv.value))

            asyncio.run(amain())
        else:
            raise AssertionError(f"variant {v}")
    except Exception as e:  # noqa: BLE001 - mapped to its result kind below
        exc = e
    exp = case.sc["expect"]
    log = case.led.log()
    check_records(case, case.key)
    kind = result_kind(exc, effect.raised)
    assert kind == exp["result"], f"result {kind}, expected {exp['result']} ({exc!r})"
    if exp.get("cause") == "deadline":
        cause = None if exc is None else exc.__cause__
        assert isinstance(cause, DeadlineExceeded), f"the cause of {exc!r} is {cause!r}"
    elif "cause" in exp:
        raise AssertionError(f"cause {exp['cause']}")
    check_carried(case, exc, effect)
    check_replay(case, got[0] if got else None)
    for name in ("effect_calls", "remote_writes"):
        if name in exp:
            assert getattr(case, name) == exp[name], f"{name}: {getattr(case, name)}, expected {exp[name]}"
    check_calls(case, {case.key}, log)
    check_next_claim(case)


# ------------------------------------------------------------------ middleware


@dataclass
class Sent:
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _handler_steps(case: Case) -> list[str]:
    steps: list[str] = list(case.sc.get("handler", []))
    if case.sc["subject"] != "middleware":
        return ["respond:201"]  # a Reconciler scenario's app: setup and the next request only
    assert steps, "a middleware scenario without handler steps"
    for s in steps[:-1]:
        assert s == "write", f"handler step {s}"
    last = steps[-1]
    assert last in ("raise_not_sent", "raise_other") or last.startswith(("respond:", "respond_large:")), f"handler {last}"
    return steps


def _large(case: Case) -> bytes:
    return json.dumps({"pad": "x" * (int(case.mw["max_body_bytes"]) * 4)}).encode()


def _committed(case: Case, hook: dict[str, Any]) -> Committed:
    resp = hook["response"]
    body = _large(case) if resp.get("large") else json.dumps(resp["body"]).encode()
    return Committed(int(resp["status"]), [("content-type", "application/json")], body)


class Handler:
    """The scenario's handler steps, and the setups' handlers."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.steps = _handler_steps(case)
        # "scenario"; "fail" (mw_unknown_record), "hold" (mw_request_held);
        # "next" (next_request: write, respond:201; not counted).
        self.mode = "scenario"
        self.entered = threading.Event()

    def answer(self) -> tuple[int, bytes]:
        """(status, JSON body) or raises, as the steps say."""
        case = self.case
        if self.mode == "fail":
            raise RuntimeError("fault-vectors setup: the handler failed")
        if self.mode == "hold":
            return 201, b'{"held":true}'
        if self.mode == "next":
            return 201, b'{"charge":"ch_next"}'
        if case.counting:
            case.handler_calls += 1
        for s in self.steps[:-1]:
            case.remote_writes += 1
        last = self.steps[-1]
        if last == "raise_not_sent":
            raise EffectNotSent("fault-vectors: the handler did nothing")
        if last == "raise_other":
            raise RuntimeError("fault-vectors: the handler failed")
        what, status = last.split(":")
        if what == "respond_large":
            return int(status), _large(case)
        return int(status), json.dumps({"charge": "ch_live", "run": case.handler_calls}).encode()


def _mw_hook_answer(case: Case, request: Any) -> Any:
    hook = case.sc["hook"]
    case.hook_saw = {
        "idempotency_key": request.idempotency_key,
        "principal": request.principal,
        "method": request.method,
        "path": request.target,
        "body": json.loads(request.body) if request.body else None,
    }
    finding = hook["finding"]
    if finding == "committed":
        return _committed(case, hook)
    if finding == "raise":
        raise RuntimeError("fault-vectors: the hook failed")
    assert finding in ("not_committed", "unavailable"), f"hook finding {finding}"
    return finding


def mw_options(case: Case, hook: Any, is_async: bool) -> dict[str, Any]:
    return dict(
        on_replay=mw_replay_hook(case, is_async),
        principal=fixed_principal(case.principal),
        namespace=NAMESPACE,
        lease_ms=int(case.opts["lease_ms"]),
        max_stored_body=int(case.mw["max_body_bytes"]),
        release_on=tuple(case.mw["release_on"]),
        wait=float(case.mw["wait_s"]),
        ledger_deadline=case.deadline,
        hook_timeout=case.hook_timeout,
        reconcile=hook,
    )


class AsgiApp:
    def __init__(self, case: Case, url: str, with_hook: bool) -> None:
        self.case = case
        self.handler = Handler(case)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.ledger = AsyncClient(url)

        async def charges(request: Request) -> Response:
            await request.body()
            if self.handler.mode == "hold":
                self.entered.set()
                await asyncio.wait_for(self.gate.wait(), WAIT_S)
            status, body = self.handler.answer()
            return Response(body, status_code=status, media_type="application/json")

        async def hook(lkey: str, fence: int, request: AsgiRequest) -> Any:
            case.started()
            h = case.sc["hook"]
            if h.get("sleep_ms"):
                await asyncio.sleep(float(h["sleep_ms"]) / 1000.0)
            if h["finding"] == "hang":
                await asyncio.Event().wait()  # cancelled at hook_timeout
            return _mw_hook_answer(case, request)

        self.app = Starlette(
            routes=[Route(case.mw["path"], charges, methods=[case.mw["method"]])],
            middleware=[Middleware(AsgiIdempotency, client=self.ledger, **mw_options(case, hook if with_hook else None, True))],
        )

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app, raise_app_exceptions=False), base_url="http://app.test"
        )


class WsgiApp:
    def __init__(self, case: Case, url: str, with_hook: bool) -> None:
        self.case = case
        self.handler = Handler(case)
        self.gate = threading.Event()
        self.ledger = Client(url)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            n = int(environ.get("CONTENT_LENGTH") or 0)
            environ["wsgi.input"].read(n)
            if self.handler.mode == "hold":
                self.handler.entered.set()
                assert self.gate.wait(WAIT_S)
            status, body = self.handler.answer()
            start_response(f"{status} X", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]

        def hook(lkey: str, fence: int, request: WsgiRequest) -> Any:
            case.started()
            h = case.sc["hook"]
            if h.get("sleep_ms"):
                time.sleep(float(h["sleep_ms"]) / 1000.0)
            if h["finding"] == "hang":
                case.release.wait(30)  # see run_once_hook: committing, had it not been abandoned
                return Committed(201, [("content-type", "application/json")], b'{"late":true}')
            return _mw_hook_answer(case, request)

        self.mw = WsgiIdempotency(app, client=self.ledger, **mw_options(case, hook if with_hook else None, False))

    def http(self) -> httpx.Client:
        return httpx.Client(transport=httpx.WSGITransport(app=self.mw), base_url="http://app.test")


def _request_kwargs(case: Case, body: Any = None) -> dict[str, Any]:
    return {
        "method": case.mw["method"],
        "url": case.mw["path"],
        "content": json.dumps(case.mw["body"] if body is None else body).encode(),
        "headers": {"Idempotency-Key": case.key, "content-type": "application/json"},
    }


def check_mw_answer(case: Case, got: Sent) -> None:
    exp = case.sc["expect"]
    assert got.status == exp["status"], f"status {got.status} ({got.body[:300]!r}), expected {exp['status']}"
    if "code" in exp:
        assert got.json().get("code") == exp["code"], f"answer {got.body[:300]!r}, expected code {exp['code']}"
    if exp.get("retry_after"):
        assert "retry-after" in got.headers, f"no Retry-After in {dict(got.headers)}"
    if "retry_after_s" in exp:
        assert got.headers.get("retry-after") == str(exp["retry_after_s"]), dict(got.headers)
    if "body_bytes_min" in exp:
        assert len(got.body) >= exp["body_bytes_min"], len(got.body)


def check_next_request(case: Case, got: Sent | None) -> None:
    want = case.sc["expect"].get("next_request")
    if want is None:
        return
    assert got is not None
    _expect_keys(want, {"status", "code", "replayed", "body", "request_body", "on_replay_calls"})
    if "on_replay_calls" in want:
        assert case.on_replay_calls == want["on_replay_calls"], f"on_replay called {case.on_replay_calls} times"
    assert got.status == want["status"], f"next request: {got.status} {got.body[:300]!r}, expected {want}"
    if "code" in want:
        assert got.json().get("code") == want["code"], got.body[:300]
    if "replayed" in want:
        replayed = got.headers.get("idempotent-replayed") == "true"
        assert replayed == want["replayed"], f"next request replayed={replayed}, expected {want['replayed']}"
    if "body" in want:
        assert got.json() == want["body"], got.body[:300]


def check_hook_saw(case: Case) -> None:
    want = case.sc["expect"].get("hook_saw")
    if want is None:
        return
    assert case.hook_saw is not None, "the hook was never asked"
    expected = {k: case.sub(v) if isinstance(v, str) else v for k, v in want.items()}
    got = {k: case.hook_saw.get(k) for k in expected}
    assert got == expected, f"the hook saw {case.hook_saw}, expected {expected}"


def _next_body(case: Case) -> Any:
    want = case.sc["expect"].get("next_request") or {}
    return want.get("request_body")


def run_middleware(case: Case) -> None:
    _expect_keys(
        case.sc["expect"],
        {
            "status", "code", "retry_after", "retry_after_s", "body_bytes_min", "handler_calls", "remote_writes",
            "calls", "record", "next_request", "hook_saw", "on_replay_calls",
        },
    )
    with_hook = "hook" in case.sc
    setup = list(case.sc.get("setup", []))
    assert set(setup) <= {"mw_unknown_record", "mw_request_held"}, f"setup {setup}"
    case.led.clear()
    if case.variant == "asgi":
        first, nxt, log = asyncio.run(_asgi_case(case, setup, with_hook))
    elif case.variant == "wsgi":
        first, nxt, log = _wsgi_case(case, setup, with_hook)
    else:
        raise AssertionError(f"variant {case.variant}")
    exp = case.sc["expect"]
    check_mw_answer(case, first)
    for name in ("handler_calls", "remote_writes"):
        if name in exp:
            assert getattr(case, name) == exp[name], f"{name}: {getattr(case, name)}, expected {exp[name]}"
    check_calls(case, {case.ledger_key}, log)
    check_hook_saw(case)
    if "on_replay_calls" in exp:
        assert case.on_replay_calls_first == exp["on_replay_calls"], f"on_replay called {case.on_replay_calls_first} times"
    check_next_request(case, nxt)


async def _asgi_case(case: Case, setup: list[str], with_hook: bool) -> tuple[Sent, Sent | None, list[dict[str, Any]]]:
    a = AsgiApp(case, case.led.proxy_url, with_hook)
    held: asyncio.Task[httpx.Response] | None = None
    async with a.http() as h:
        if "mw_unknown_record" in setup:
            a.handler.mode = "fail"
            r = await h.request(**_request_kwargs(case))
            assert r.status_code == 500, r.text
        if "mw_request_held" in setup:
            a.handler.mode = "hold"
            held = asyncio.get_running_loop().create_task(h.request(**_request_kwargs(case)))
            await asyncio.wait_for(a.entered.wait(), WAIT_S)
        a.handler.mode = "scenario"
        case.set_faults([case.ledger_key])
        try:
            r = await h.request(**_request_kwargs(case))
            first = Sent(r.status_code, r.headers, r.content)
            case.on_replay_calls_first = case.on_replay_calls
            log = case.led.log()
            check_records(case, case.ledger_key)
            case.led.clear()
            case.counting = False
            a.handler.mode = "next"
            nxt = None
            if "next_request" in case.sc["expect"]:
                r2 = await h.request(**_request_kwargs(case, _next_body(case)))
                nxt = Sent(r2.status_code, r2.headers, r2.content)
        finally:
            a.gate.set()
            if held is not None:
                done = await asyncio.wait_for(held, WAIT_S)
                assert done.status_code == 201, done.text
            await a.ledger.aclose()
    return first, nxt, log


def _wsgi_case(case: Case, setup: list[str], with_hook: bool) -> tuple[Sent, Sent | None, list[dict[str, Any]]]:
    a = WsgiApp(case, case.led.proxy_url, with_hook)
    held: threading.Thread | None = None
    held_status: list[int] = []
    with a.http() as h:
        if "mw_unknown_record" in setup:
            a.handler.mode = "fail"
            r = h.request(**_request_kwargs(case))
            assert r.status_code == 500, r.text
        if "mw_request_held" in setup:
            a.handler.mode = "hold"

            def hold() -> None:
                with a.http() as h2:
                    held_status.append(h2.request(**_request_kwargs(case)).status_code)

            held = threading.Thread(target=hold, daemon=True)
            held.start()
            assert a.handler.entered.wait(WAIT_S), "the held request's handler never started"
        a.handler.mode = "scenario"
        case.set_faults([case.ledger_key])
        try:
            r = h.request(**_request_kwargs(case))
            first = Sent(r.status_code, r.headers, r.content)
            case.on_replay_calls_first = case.on_replay_calls
            log = case.led.log()
            check_records(case, case.ledger_key)
            case.led.clear()
            case.counting = False
            a.handler.mode = "next"
            nxt = None
            if "next_request" in case.sc["expect"]:
                r2 = h.request(**_request_kwargs(case, _next_body(case)))
                nxt = Sent(r2.status_code, r2.headers, r2.content)
        finally:
            a.gate.set()
            if held is not None:
                held.join(WAIT_S)
                assert held_status == [201], held_status
            a.ledger.close()
    return first, nxt, log


# ------------------------------------------------------------------ reconciler


class Recording(httpx.BaseTransport):
    """Keeps the URL of every request (the listing's query)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.urls: list[httpx.URL] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(request.url)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class ARecording(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.urls: list[httpx.URL] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(request.url)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def reconciler_hooks(case: Case, is_async: bool) -> dict[str, Any]:
    hooks: dict[str, Any] = {}
    for spec in case.sc["hooks"]:
        finding = spec["finding"]
        assert finding in ("committed", "not_committed", "unavailable", "raise", "hang"), f"hook finding {finding}"
        sleep = float(spec.get("sleep_ms", 0)) / 1000.0
        middleware = bool(spec.get("middleware"))

        def answer(spec: dict[str, Any] = spec, finding: str = finding, middleware: bool = middleware) -> Any:
            if finding == "committed":
                return _committed(case, spec) if middleware else Done({"ok": True})
            if finding == "raise":
                raise RuntimeError("fault-vectors: the hook failed")
            return finding

        def saw(record: MiddlewareRecord) -> None:
            case.hook_saw = {"idempotency_key": record.idempotency_key, "principal": record.principal}

        if is_async:

            async def ahook(key: str, fence: int, *rest: Any, sleep: float = sleep, finding: str = finding,
                            answer: Callable[[], Any] = answer) -> Any:
                case.started()
                if rest:
                    saw(rest[0])
                if sleep:
                    await asyncio.sleep(sleep)
                if finding == "hang":
                    await asyncio.Event().wait()
                return answer()

            hook: Any = ahook
        else:

            def shook(key: str, fence: int, *rest: Any, sleep: float = sleep, finding: str = finding,
                      answer: Callable[[], Any] = answer) -> Any:
                case.started()
                if rest:
                    saw(rest[0])
                if sleep:
                    time.sleep(sleep)
                if finding == "hang":
                    case.release.wait(30)  # see run_once_hook: committing, had it not been abandoned
                    if middleware:
                        return _committed(case, {"response": {"status": 201, "body": {"late": True}}})
                    return Done({"late": True})
                return answer()

            hook = shook
        if middleware:
            hook = MiddlewareHook(hook, max_stored_body=int(case.mw["max_body_bytes"]))
        hooks[case.sub(spec["prefix"])] = hook
    return hooks


def _reconciler_setup(case: Case) -> set[str]:
    """Runs the setup; the ledger keys the scenario is about."""
    keys: set[str] = set()
    for s in case.sc.get("setup", []):
        if s == "unknown_record":
            case.setup_unknown()
            keys.add(case.key)
        elif s.startswith("unknown_record:"):
            suffix = s.split(":", 1)[1]
            case.setup_unknown(suffix)
            keys.add(case.key_of(suffix))
        elif s == "mw_unknown_record":
            _mw_setup_unknown(case)
            keys.add(case.ledger_key)
        else:
            raise AssertionError(f"setup {s}")
    return keys


def _mw_setup_unknown(case: Case) -> None:
    if case.variant == "async_reconciler":

        async def main() -> None:
            a = AsgiApp(case, case.led.proxy_url, False)
            a.handler.mode = "fail"
            async with a.http() as h:
                r = await h.request(**_request_kwargs(case))
                assert r.status_code == 500, r.text
            await a.ledger.aclose()

        asyncio.run(main())
    else:
        w = WsgiApp(case, case.led.proxy_url, False)
        w.handler.mode = "fail"
        with w.http() as h:
            r = h.request(**_request_kwargs(case))
            assert r.status_code == 500, r.text
        w.ledger.close()


def _mw_next_request(case: Case) -> Sent:
    if case.variant == "async_reconciler":

        async def main() -> Sent:
            a = AsgiApp(case, case.led.proxy_url, False)
            async with a.http() as h:
                r = await h.request(**_request_kwargs(case))
            await a.ledger.aclose()
            return Sent(r.status_code, r.headers, r.content)

        return asyncio.run(main())
    w = WsgiApp(case, case.led.proxy_url, False)
    with w.http() as h:
        r = h.request(**_request_kwargs(case))
    w.ledger.close()
    return Sent(r.status_code, r.headers, r.content)


def run_reconciler(case: Case) -> None:
    _expect_keys(case.sc["expect"], {"counts", "list_key_prefix", "record", "records", "calls", "hook_saw", "next_request", "next_claim"})
    keys = _reconciler_setup(case)
    target = case.ledger_key if case.ledger_key in keys else case.key
    case.set_faults(sorted(keys))
    opts: dict[str, Any] = dict(
        lease_ms=int(case.opts["lease_ms"]), deadline=case.deadline, hook_timeout=case.hook_timeout
    )
    if case.variant == "reconciler":
        rec_t = Recording()
        with Client(case.led.proxy_url, transport=rec_t) as c:
            counts = Reconciler(c, reconciler_hooks(case, False), **opts).sweep()
        urls = rec_t.urls
    elif case.variant == "async_reconciler":
        arec_t = ARecording()

        async def main() -> dict[str, int]:
            async with AsyncClient(case.led.proxy_url, transport=arec_t) as c:
                return await AsyncReconciler(c, reconciler_hooks(case, True), **opts).sweep()

        counts = asyncio.run(main())
        urls = arec_t.urls
    else:
        raise AssertionError(f"variant {case.variant}")
    log = case.led.log()
    exp = case.sc["expect"]
    check_records(case, target)
    assert counts == exp["counts"], f"counts {counts}, expected {exp['counts']}"
    if "list_key_prefix" in exp:
        # What the proxy saw, and what the client sent.
        assert exp["list_key_prefix"] is None, exp["list_key_prefix"]
        seen = [parse_qs(c.get("query") or "") for c in log if c["call"] == "list"]
        assert seen and all("key_prefix" not in q for q in seen), seen
        lists = [u for u in urls if u.path == "/v1/operations"]
        assert lists and all("key_prefix" not in u.params for u in lists), [str(u) for u in lists]
    check_calls(case, keys, log)
    check_hook_saw(case)
    case.led.clear()
    if "next_request" in exp:
        check_next_request(case, _mw_next_request(case))
    check_next_claim(case)


def run_lifecycle(case: Case) -> None:
    exp = case.sc["expect"]
    _expect_keys(exp, {"second_start", "stop_timeout_ms", "stop_returns"})
    _reconciler_setup(case)
    case.set_faults([case.key])
    limit = float(exp["stop_timeout_ms"]) / 1000.0
    opts: dict[str, Any] = dict(
        lease_ms=int(case.opts["lease_ms"]), deadline=case.deadline, hook_timeout=case.hook_timeout
    )
    if case.variant == "reconciler":
        with Client(case.led.proxy_url) as c:
            r = Reconciler(c, reconciler_hooks(case, False), **opts)
            r.start(interval=0.05)
            with pytest.raises(RuntimeError) as second:
                r.start(interval=0.05)
            assert exp["second_start"] == "refused", exp
            assert case.hook_started.wait(WAIT_S), "the hook never started"
            t0 = time.monotonic()
            ended = r.stop(timeout=limit)
            took = time.monotonic() - t0
            case.release.set()
            r.stop(timeout=WAIT_S)  # the loop ends before the client closes
    elif case.variant == "async_reconciler":

        async def main() -> tuple[bool, float, pytest.ExceptionInfo[RuntimeError]]:
            started = case.ahook_started = asyncio.Event()
            async with AsyncClient(case.led.proxy_url) as c:
                r = AsyncReconciler(c, reconciler_hooks(case, True), **opts)
                r.start(interval=0.05)
                with pytest.raises(RuntimeError) as second:
                    r.start(interval=0.05)
                await asyncio.wait_for(started.wait(), WAIT_S)
                t0 = time.monotonic()
                ended = await r.stop(timeout=limit)
                took = time.monotonic() - t0
                await r.stop(timeout=WAIT_S)
                return ended, took, second

        ended, took, second = asyncio.run(main())
    else:
        raise AssertionError(f"variant {case.variant}")
    assert "already running" in str(second.value)
    assert exp["stop_returns"] is True
    assert took <= limit + 0.25, f"stop({limit}) took {took:.3f} s"
    assert ended, "the loop had not ended when stop() returned"


# ------------------------------------------------------------------ the cases


@pytest.mark.parametrize("sc,variant", list(_cases()))
def test_fault_vector(sc: dict[str, Any], variant: str, shared_ledger: Ledger, tmp_path: Path) -> None:
    led = start_ledger(tmp_path) if sc.get("fresh_ledger") else shared_ledger
    case = Case(sc, variant, led)
    try:
        subject = sc["subject"]
        if subject == "run_once":
            run_run_once(case)
        elif subject == "middleware":
            run_middleware(case)
        elif subject == "reconciler":
            run_reconciler(case)
        elif subject == "reconciler_lifecycle":
            run_lifecycle(case)
        else:
            raise AssertionError(f"subject {subject!r}: this runner cannot run it")
    finally:
        case.release.set()  # hooks that "never return" return now
        if led is not shared_ledger:
            stop_ledger(led)
        else:
            led.clear()


def test_every_scenario_has_a_case_per_variant() -> None:
    ids = [sc["id"] for sc in SCENARIOS]
    assert len(ids) == len(set(ids)), "duplicate scenario ids"
    rows = {r["id"] for r in VECTORS["rows"]}
    assert {sc["row"] for sc in SCENARIOS} == rows, "a row without scenarios, or a scenario of an unknown row"
    for sc in SCENARIOS:
        assert sc["subject"] in VARIANTS, f"{sc['id']}: subject {sc['subject']!r} has no Python runner"
