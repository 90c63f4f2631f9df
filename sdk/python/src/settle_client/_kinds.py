"""Which client a caller gave: the sync ``Client`` where threads run, the
``AsyncClient`` where an event loop runs. Given the other one, a run would
fail only at its first ledger call (``object Grant can't be used in 'await'
expression``), possibly after a lease was taken; so the mismatch is refused
where the client is given, naming the class that fits."""

from __future__ import annotations

from .client import AsyncClient, Client

__all__ = ["require_async", "require_sync"]


def require_sync(client: object, what: str, instead: str) -> Client:
    """``client`` when it is a ``Client``; else ``TypeError`` naming the
    sync client and, for an ``AsyncClient``, ``instead`` (the async twin)."""
    if isinstance(client, Client):
        return client
    hint = (
        f"; with an AsyncClient use {instead}"
        if isinstance(client, AsyncClient)
        else " (or a settle_local.LocalLedger, which is one)"
    )
    raise TypeError(f"{what} needs a settle_client.Client (the sync client), not {type(client).__name__}{hint}")


def require_async(client: object, what: str, instead: str) -> AsyncClient:
    """``client`` when it is an ``AsyncClient``; else ``TypeError`` naming
    ``AsyncClient`` (a ``settle_local.LocalLedger``: its ``.aio``) and, for
    a ``Client``, ``instead`` (the sync twin)."""
    if isinstance(client, AsyncClient):
        return client
    hint = f"; with a Client use {instead}" if isinstance(client, Client) else ""
    raise TypeError(
        f"{what} needs a settle_client.AsyncClient, not {type(client).__name__} "
        f"(a settle_local.LocalLedger: pass its .aio){hint}"
    )
