"""``@idempotent``: the Powertools-style decorator over ``run_once``.

It answers the complaints of AWS Lambda Powertools' idempotency users:

- the ledger key is exactly what ``key(...)`` returns (plus an optional
  ``namespace`` prefix): renaming or moving the function does not change it;
- every call tells whether it was a replay: ``fn.invoke(...)`` returns an
  ``Invocation`` with ``value``, ``replayed`` and ``receipt``;
- "in progress" is the ledger's lease: it is heartbeated while the function
  runs and expires ``lease_ms`` after a crash, and callers that find it in
  flight wait only until their ``deadline``;
- the payload is validated before anything is cached or replayed: the
  fingerprint of the payload is checked by every claim (another payload under
  the same key raises ``FingerprintMismatch``, never returns another
  request's result), and the return value must be JSON (``validate`` can add
  checks; ``default=`` converts what is not JSON) before it is settled.

It takes every option ``run_once`` takes (``marks_dispatch``, ``reconcile``
— a hook or ``"resend"`` —, ``hook_timeout``, ``lease_ms``, ``retention_s``, ``deadline``,
``worker``, ``default``); inside the function, ``settle_client.dispatch()``
(``await settle_client.dispatch()`` in an ``async def``) marks the commit
boundary and ``settle_client.effect_context()`` gives the key and fence to
pass to the remote.

The function's return value is stored as the operation's result (encoded
as JSON, through ``default`` for values that are not JSON; a pydantic model
or a dataclass as its JSON); every call, first or replay, returns that
stored JSON (dicts, lists...), restored to the function's return annotation
when it names a pydantic model or a dataclass (also in ``list[...]``,
``tuple[..., ...]``, ``dict[str, ...]``, ``Optional[...]``): first call and
replay give equal typed objects.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, ParamSpec, TypeVar, overload

from ._kinds import require_async, require_sync
from ._typed import return_type, unserializable_part
from .client import AsyncClient, Client
from .types import Receipt
from .worker import (
    AsyncEffectContext,
    AsyncReconcileHook,
    AsyncReplayHook,
    Done,
    EffectContext,
    ReconcileHook,
    ReplayHook,
    Serializer,
    run_once,
    run_once_async,
)

__all__ = ["idempotent", "Invocation", "IdempotentFunction", "AsyncIdempotentFunction"]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Invocation(Generic[R]):
    """One call: the ``value`` (the stored JSON), whether it was a
    ``replayed`` outcome (the function did not run), whether it was
    ``reconciled`` (a reconcile hook or a resend resolved an earlier
    attempt), and the ``receipt``."""

    value: R
    replayed: bool
    receipt: Receipt
    reconciled: bool = False


def _payload_default(*args: Any, **kwargs: Any) -> Any:
    if args:
        return args[0]
    if len(kwargs) == 1:
        return next(iter(kwargs.values()))
    raise TypeError("@idempotent: pass payload= to say which argument is the request")


@dataclass(frozen=True)
class _Options:
    key: Callable[..., str]
    principal: str | Callable[..., str]
    scopes: Sequence[str]
    generation: int
    namespace: str
    payload: Callable[..., Any]
    fields: Sequence[str] | None
    lease_ms: int
    deadline: float | None
    validate: Callable[[Any], None] | None
    marks_dispatch: bool
    reconcile: Any  # ReconcileHook / AsyncReconcileHook / "resend" / None, by the client's kind
    hook_timeout: float | None
    retention_s: int | None
    worker: str | None
    default: Serializer | None
    on_replay: Any  # ReplayHook / AsyncReplayHook, by the client's kind

    def key_of(self, args: Any, kwargs: Any) -> str:
        return self.namespace + self.key(*args, **kwargs)

    def principal_of(self, args: Any, kwargs: Any) -> str:
        return self.principal(*args, **kwargs) if callable(self.principal) else self.principal

    def done(self, value: Any) -> Done:
        if self.validate is not None:
            self.validate(value)  # raises before anything is stored
        return Done(value)


class IdempotentFunction(Generic[P, R]):
    """A synchronous function made idempotent by ``@idempotent``."""

    __name__: str
    __qualname__: str

    def __init__(self, fn: Callable[P, R], client: Client | Callable[[], Client], opts: _Options) -> None:
        self._fn = fn
        self._client = client
        self._opts = opts
        # Resolved once: the stored JSON is restored to it on every call.
        self._result_type = return_type(fn)
        functools.update_wrapper(self, fn)

    def invoke(self, *args: P.args, **kwargs: P.kwargs) -> Invocation[R]:
        o = self._opts

        def effect(ctx: EffectContext) -> Done:
            return o.done(self._fn(*args, **kwargs))

        client = self._client if isinstance(self._client, Client) else self._client()
        r = run_once(
            require_sync(client, f"@idempotent on {self.__qualname__} (a def)", "an async def function"),
            o.key_of(args, kwargs),
            o.payload(*args, **kwargs),
            effect,
            principal=o.principal_of(args, kwargs),
            scopes=o.scopes,
            generation=o.generation,
            fields=o.fields,
            lease_ms=o.lease_ms,
            deadline=o.deadline,
            marks_dispatch=o.marks_dispatch,
            reconcile=o.reconcile,
            hook_timeout=o.hook_timeout,
            retention_s=o.retention_s,
            worker=o.worker,
            default=o.default,
            result_type=self._result_type,
            on_replay=o.on_replay,
        )
        value: R = r.value
        return Invocation(value, r.replayed, r.receipt, r.reconciled)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.invoke(*args, **kwargs).value


class AsyncIdempotentFunction(Generic[P, R]):
    """A coroutine function made idempotent by ``@idempotent``."""

    __name__: str
    __qualname__: str

    def __init__(
        self, fn: Callable[P, Awaitable[R]], client: AsyncClient | Callable[[], AsyncClient], opts: _Options
    ) -> None:
        self._fn = fn
        self._client = client
        self._opts = opts
        self._result_type = return_type(fn)  # of an async def: the awaited type
        functools.update_wrapper(self, fn)

    async def invoke(self, *args: P.args, **kwargs: P.kwargs) -> Invocation[R]:
        o = self._opts

        async def effect(ctx: AsyncEffectContext) -> Done:
            return o.done(await self._fn(*args, **kwargs))

        client = self._client if isinstance(self._client, AsyncClient) else self._client()
        r = await run_once_async(
            require_async(client, f"@idempotent on {self.__qualname__} (an async def)", "a def function"),
            o.key_of(args, kwargs),
            o.payload(*args, **kwargs),
            effect,
            principal=o.principal_of(args, kwargs),
            scopes=o.scopes,
            generation=o.generation,
            fields=o.fields,
            lease_ms=o.lease_ms,
            deadline=o.deadline,
            marks_dispatch=o.marks_dispatch,
            reconcile=o.reconcile,
            hook_timeout=o.hook_timeout,
            retention_s=o.retention_s,
            worker=o.worker,
            default=o.default,
            result_type=self._result_type,
            on_replay=o.on_replay,
        )
        value: R = r.value
        return Invocation(value, r.replayed, r.receipt, r.reconciled)

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return (await self.invoke(*args, **kwargs)).value


@overload
def idempotent(
    client: Client | Callable[[], Client],
    *,
    key: Callable[..., str],
    principal: str | Callable[..., str],
    scopes: Sequence[str] = (),
    generation: int = 0,
    namespace: str = "",
    payload: Callable[..., Any] | None = None,
    fields: Sequence[str] | None = None,
    lease_ms: int = 30000,
    deadline: float | None = 30.0,
    validate: Callable[[Any], None] | None = None,
    marks_dispatch: bool = False,
    reconcile: ReconcileHook | Literal["resend"] | None = None,
    hook_timeout: float | None = None,
    retention_s: int | None = None,
    worker: str | None = None,
    default: Serializer | None = None,
    on_replay: ReplayHook | None = None,
) -> Callable[[Callable[P, R]], IdempotentFunction[P, R]]: ...


@overload
def idempotent(
    client: AsyncClient | Callable[[], AsyncClient],
    *,
    key: Callable[..., str],
    principal: str | Callable[..., str],
    scopes: Sequence[str] = (),
    generation: int = 0,
    namespace: str = "",
    payload: Callable[..., Any] | None = None,
    fields: Sequence[str] | None = None,
    lease_ms: int = 30000,
    deadline: float | None = 30.0,
    validate: Callable[[Any], None] | None = None,
    marks_dispatch: bool = False,
    reconcile: AsyncReconcileHook | Literal["resend"] | None = None,
    hook_timeout: float | None = None,
    retention_s: int | None = None,
    worker: str | None = None,
    default: Serializer | None = None,
    on_replay: AsyncReplayHook | None = None,
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], AsyncIdempotentFunction[P, R]]: ...


def idempotent(
    client: Client | AsyncClient | Callable[[], Client] | Callable[[], AsyncClient],
    *,
    key: Callable[..., str],
    principal: str | Callable[..., str],
    scopes: Sequence[str] = (),
    generation: int = 0,
    namespace: str = "",
    payload: Callable[..., Any] | None = None,
    fields: Sequence[str] | None = None,
    lease_ms: int = 30000,
    deadline: float | None = 30.0,
    validate: Callable[[Any], None] | None = None,
    marks_dispatch: bool = False,
    reconcile: Any = None,
    hook_timeout: float | None = None,
    retention_s: int | None = None,
    worker: str | None = None,
    default: Serializer | None = None,
    on_replay: Any = None,
) -> Any:
    """Make a function idempotent under the key ``namespace + key(*args)``.

    ``key``, ``principal`` (when callable) and ``payload`` receive the
    function's own arguments. The fingerprint is that of ``payload(*args)``
    (default: the first argument), or of its ``fields`` (JSON pointers).
    With a ``Client`` the function must be synchronous; with an
    ``AsyncClient``, a coroutine function (and ``reconcile``, when a hook,
    an ``async def`` too). ``marks_dispatch``, ``reconcile`` (a hook or
    ``"resend"``), ``hook_timeout``, ``lease_ms``, ``retention_s``,
    ``deadline``, ``worker``, ``default`` and ``on_replay`` are those of
    ``run_once`` (``on_replay(outcome, receipt)``, called on every replay:
    its answer is the call's value; with an ``AsyncClient`` it may be an
    ``async def``).

    ``client`` may also be a callable without arguments that returns the
    client, called on every run (``client=lambda: app.ledger``): a
    module-level function then uses whatever ledger is current, e.g. a test
    fixture's. The function's kind (``def`` or ``async def``) then says
    which client it must return.

    A return annotation that names a type the result cannot be stored as
    (``-> Decimal``, ``-> datetime``: not JSON, not a pydantic model nor a
    dataclass) warns at decoration (``UserWarning``, the
    ``warnings`` module) unless ``default=`` is given: such a result would
    raise ``ResultNotSerializable`` only on its first run.
    """
    opts = _Options(
        key=key,
        principal=principal,
        scopes=tuple(scopes),
        generation=generation,
        namespace=namespace,
        payload=payload or _payload_default,
        fields=fields,
        lease_ms=lease_ms,
        deadline=deadline,
        validate=validate,
        marks_dispatch=marks_dispatch,
        reconcile=reconcile,
        hook_timeout=hook_timeout,
        retention_s=retention_s,
        worker=worker,
        default=default,
        on_replay=on_replay,
    )

    def wrap(fn: Callable[..., Any]) -> Any:
        if default is None:
            _warn_unserializable(fn)
        if isinstance(client, AsyncClient):
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(
                    "@idempotent with an AsyncClient needs an async def function "
                    "(for a def function, pass a settle_client.Client)"
                )
            return AsyncIdempotentFunction(fn, client, opts)
        if isinstance(client, Client):
            if inspect.iscoroutinefunction(fn):
                raise TypeError(
                    "@idempotent on an async def function needs a settle_client.AsyncClient, not Client "
                    "(a settle_local.LocalLedger: pass its .aio)"
                )
            return IdempotentFunction(fn, client, opts)
        if not callable(client):
            raise TypeError(
                "@idempotent: client is a settle_client.Client, an AsyncClient or a function returning one, "
                f"not {type(client).__name__}"
            )
        factory: Callable[[], Any] = client  # checked on each run: require_sync / require_async
        if inspect.iscoroutinefunction(fn):
            return AsyncIdempotentFunction(fn, factory, opts)
        return IdempotentFunction(fn, factory, opts)

    return wrap


def _warn_unserializable(fn: Callable[..., Any]) -> None:
    part = unserializable_part(return_type(fn))
    if part is not None:
        warnings.warn(
            f"@idempotent on {getattr(fn, '__qualname__', fn)!r}: its return annotation names {part}, which "
            "settle_client cannot store as JSON (no serializer for it); pass default= (a function that turns "
            "it into JSON, as json.dumps's default) or return JSON, a pydantic model or a dataclass",
            UserWarning,
            stacklevel=3,
        )
