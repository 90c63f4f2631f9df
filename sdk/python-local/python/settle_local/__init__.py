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
process at a time may open a directory.

The native calls release the GIL; the async view runs them on a worker
thread (asyncio's default executor; anyio's threads under trio), so an
fsync never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import anyio.to_thread
import httpx

try:
    from settle_client import AsyncClient, Client
except ImportError as e:  # pragma: no cover - the install command installs both
    raise ImportError(
        "settle_local needs settle_client: pip install ./sdk/python ./sdk/python-local"
    ) from e

from ._native import Ledger as _Native

__all__ = ["LocalLedger", "__version__"]
__version__ = "0.1.0"

# The client needs a base URL; nothing resolves or connects to it.
_URL = "http://settle.local"


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


class LocalLedger(Client):
    """A settle ledger in this process; a ``Client`` (``.aio``: an ``AsyncClient``).

    ``data``: a directory for the embedded engine (created if missing); ``None``
    (the default) keeps everything in memory and nothing survives the object.
    """

    def __init__(self, data: str | os.PathLike[str] | None = None, *, headers: dict[str, str] | None = None) -> None:
        self._native = _Native(os.fspath(data) if data is not None else None)
        self.data = os.fspath(data) if data is not None else None
        super().__init__(_URL, transport=_Transport(self._native), headers=headers)
        self.aio = AsyncClient(_URL, transport=_AsyncTransport(self._native), headers=headers)

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
