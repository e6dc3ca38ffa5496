"""ASGI rate-limit middleware (Starlette, FastAPI, any ASGI app)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..aio import AsyncClient
from ..errors import QuotadError
from . import _decide
from ._common import Options
from ._keys import IpPrefixes, KeyExtractor, RequestInfo

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware:
    """Checks every HTTP request with quotad before the app sees it.

    Answers as the Rust ``RateLimitLayer``: an allowed request reaches the
    app and its response gets ``RateLimit-Policy``, ``RateLimit`` and
    ``X-RateLimit-*`` headers; a denied one is ``429 Too Many Requests``
    with those headers and, when waiting makes room, ``Retry-After``
    (seconds, rounded up, at least 1). No key in the request is 400 (500
    when the key is the peer address and the server gives none); a key
    quotad refuses is 400; another refusal (an unknown policy) is 500;
    quotad unreachable is 503 unless the client fails open (the request
    passes, without headers) .

    ``client``: an :class:`~quotad.AsyncClient`, or a function making one
    (called on the first request, inside the server's event loop).
    ``policy``: the named policy every request is checked under. ``key``: a
    :class:`KeyExtractor` (default: the peer address). ``cost``: units a
    request spends (default 1). ``ip_prefixes``: how much of an address
    keys it. ``window_secs``: adds ``w=`` to ``RateLimit-Policy``.
    ``headers``: ``False`` leaves the rate-limit headers out.

    >>> app.add_middleware(RateLimitMiddleware, client=lambda: AsyncClient(addr),
    ...                    policy="api", key=KeyExtractor.header("x-api-key"))  # doctest: +SKIP
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: AsyncClient | Callable[[], AsyncClient],
        policy: str,
        key: KeyExtractor | None = None,
        cost: Callable[[RequestInfo], int] | None = None,
        ip_prefixes: IpPrefixes | None = None,
        window_secs: int | None = None,
        headers: bool = True,
    ) -> None:
        self.app = app
        self._client = client if isinstance(client, AsyncClient) else None
        self._make_client = None if isinstance(client, AsyncClient) else client
        self.options = Options(policy, key, cost, ip_prefixes, window_secs, headers)

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            assert self._make_client is not None
            self._client = self._make_client()
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        options = self.options
        peer = scope.get("client")
        request = RequestInfo(
            method=scope.get("method", "GET"),
            path=scope.get("path", "/"),
            headers=[(n.decode("latin-1").lower(), v) for n, v in scope.get("headers", [])],
            peer=peer[0] if peer else None,
        )
        key = options.key.extract(request, options.prefixes)
        if key is None:
            if options.key.needs_peer:
                options.log_failure("no peer address on the request", "the server gives none")
            await _respond(send, _decide.missing_key(options.key.needs_peer))
            return
        try:
            decision = await self.client.check(key, options.policy, cost=options.cost(request))
        except QuotadError as error:
            options.log_failure("rate-limit check failed", error)
            await _respond(send, _decide.failure(error))
            return
        outcome = _decide.outcome(options.policy, decision, options.window_secs, options.headers)
        if not outcome.passes:
            await _respond(send, outcome)
            return
        if not outcome.headers:
            await self.app(scope, receive, send)
            return
        names = {n.encode() for n, _ in outcome.headers}
        extra = [(n.encode(), v.encode()) for n, v in outcome.headers]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
                message = {**message, "headers": kept + extra}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _respond(send: Send, outcome: _decide.Outcome) -> None:
    headers = [(n.encode(), v.encode()) for n, v in outcome.headers]
    headers.append((b"content-length", str(len(outcome.body)).encode()))
    await send({"type": "http.response.start", "status": outcome.status, "headers": headers})
    await send({"type": "http.response.body", "body": outcome.body})
