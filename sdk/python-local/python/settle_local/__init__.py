"""settle's ledger in this process: ``LocalLedger``.

A ``LocalLedger`` is a ``settle_client.Client`` whose requests never leave
the process: they go straight into settle's own HTTP handlers (the Rust
server, compiled into this package), over the in-memory store or, with
``data="DIR"``, the embedded engine in that directory. Everything that
takes a ``Client`` takes it (``run_once``, ``idempotent``, the WSGI
middlewares, the ``Reconciler``); its ``.aio`` view is an ``AsyncClient``
for ``run_once_async``, async ``idempotent`` and the ASGI middleware.

Without ``data`` nothing is durable: the records live as long as the
object, and receipts say ``durable=False``. With ``data`` a receipt is
on disk before it is returned, as with ``settle serve --data DIR``; one
process at a time may open a directory. ``segment_bytes`` sizes the log's
segments (default 4 MiB: a new directory takes about 8 MB).

The client's calls go straight to the native ledger (no HTTP objects are
built; the answers are the server's own bytes). The native calls release
the GIL; on a directory the async view runs them on a worker thread
(asyncio's default executor; anyio's threads under trio), so an fsync
never blocks the event loop; in memory, where a call never waits, it
runs them in place.

After ``close()`` every call raises ``settle_client.LedgerClosed`` at once
(never retried).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TypeVar

import anyio.to_thread
import httpx

try:
    from settle_client import AsyncClient, Client, LedgerClosed, TransportError
    from settle_client._tracing import trace_headers
    from settle_client.client import _Req, encode_body, read_answer
except ImportError as e:  # pragma: no cover - the install command installs both
    raise ImportError(
        "settle_local needs settle_client: pip install ./sdk/python ./sdk/python-local"
    ) from e

from ._native import Closed as _Closed
from ._native import Ledger as _Native

__all__ = ["LocalLedger", "LedgerClosed", "__version__"]
__version__ = "0.1.0"

# The client needs a base URL; nothing resolves or connects to it.
_URL = "http://settle.local"


_T = TypeVar("_T")


def _closed(e: _Closed) -> LedgerClosed:
    return LedgerClosed(f"this LocalLedger is closed ({e}); open a new one")


def _call(native: _Native, headers: list[tuple[str, str]], req: _Req[_T]) -> _T:
    """One call of the client, straight into the native ledger."""
    body = encode_body(req.body) or b""
    trace = trace_headers()
    if trace:
        headers = headers + list(trace.items())
    try:
        status, content, retry_after = native.exchange(req.method, req.path, headers, body)
    except _Closed as e:
        raise _closed(e) from None
    except ValueError as e:  # a target or header the router cannot take
        raise TransportError(f"{req.method} {req.path}: {e!r}") from e
    return read_answer(req, status, content, retry_after)


def _exchange(native: _Native, request: httpx.Request, body: bytes) -> httpx.Response:
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]
    status, out_headers, content = native.request(
        request.method, request.url.raw_path.decode("ascii"), headers, body
    )
    return httpx.Response(status, headers=out_headers, content=content, request=request)


class _Transport(httpx.BaseTransport):
    def __init__(self, native: _Native) -> None:
        self._native = native

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return _exchange(self._native, request, request.read())


class _AsyncTransport(httpx.AsyncBaseTransport):
    def __init__(self, native: _Native) -> None:
        self._native = native

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        # A worker thread: the native call waits for the store (an fsync
        # on disk) with the GIL released, and the event loop keeps running.
        # A cancelled caller stops waiting at once; the call completes, as
        # a request already sent to a server would.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio
            return await anyio.to_thread.run_sync(_exchange, self._native, request, body, abandon_on_cancel=True)
        return await loop.run_in_executor(None, _exchange, self._native, request, body)


class _LocalAsync(AsyncClient):
    """The ``.aio`` view: the same direct calls, awaitable."""

    def __init__(self, native: _Native, headers: list[tuple[str, str]], extra: dict[str, str] | None) -> None:
        super().__init__(_URL, transport=_AsyncTransport(native), headers=extra)
        self._native = native
        self._pairs = headers

    async def _send(self, req: _Req[_T]) -> _T:
        if not self._native.durable:
            return _call(self._native, self._pairs, req)  # in memory: never waits
        # A worker thread: the native call waits for the store (an fsync)
        # with the GIL released, and the event loop keeps running. A
        # cancelled caller stops waiting at once; the call completes, as a
        # request already sent to a server would.
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # trio
            return await anyio.to_thread.run_sync(_call, self._native, self._pairs, req, abandon_on_cancel=True)
        return await loop.run_in_executor(None, _call, self._native, self._pairs, req)


class LocalLedger(Client):
    """A settle ledger in this process; a ``Client`` (``.aio``: an ``AsyncClient``).

    ``data``: a directory for the embedded engine (created if missing); ``None``
    (the default) keeps everything in memory and nothing survives the object.
    ``segment_bytes``: the embedded log's segment size, 65,536 to 1 GiB
    (default 4 MiB; ``settle serve``'s is 64 MiB); unused in memory.
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | None = None,
        *,
        headers: dict[str, str] | None = None,
        segment_bytes: int | None = None,
    ) -> None:
        self._native = _Native(os.fspath(data) if data is not None else None, segment_bytes)
        self.data = os.fspath(data) if data is not None else None
        super().__init__(_URL, transport=_Transport(self._native), headers=headers)
        # The caller's own headers (a JSON body's content-type is implied).
        self._pairs = list((headers or {}).items())
        self.aio: AsyncClient = _LocalAsync(self._native, self._pairs, headers)

    def _send(self, req: _Req[_T]) -> _T:
        return _call(self._native, self._pairs, req)

    @property
    def durable(self) -> bool:
        """Whether receipts survive the process (``data`` given)."""
        return self._native.durable

    def __enter__(self) -> LocalLedger:
        return self

    def close(self) -> None:
        """Closes the store (on disk: synced and unlocked); later calls raise."""
        super().close()
        self._native.close()

    def __repr__(self) -> str:
        where = f"data={self.data!r}" if self.data is not None else "in memory"
        return f"LocalLedger({where})"

    def __reduce__(self) -> Any:  # pragma: no cover - a ledger is not picklable
        raise TypeError("a LocalLedger cannot be pickled; open one per process")
