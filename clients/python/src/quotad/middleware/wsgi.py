"""WSGI rate-limit middleware (Flask, Django, any WSGI app)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..client import Client
from ..errors import QuotadError
from . import _decide
from ._common import Options
from ._keys import IpPrefixes, KeyExtractor, RequestInfo

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]

_STATUS = {
    400: "400 Bad Request",
    429: "429 Too Many Requests",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}


def _headers(environ: Environ) -> list[tuple[str, bytes]]:
    # PEP 3333 gives header values as latin-1 strings; a server joins
    # repeated lines with ", ", which is what X-Forwarded-For means anyway.
    out = []
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            header = name[5:].replace("_", "-").lower()
        elif name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            header = name.replace("_", "-").lower()
        else:
            continue
        out.append((header, str(value).encode("latin-1", "replace")))
    return out


class WSGIRateLimitMiddleware:
    """Checks every request with quotad before the WSGI app sees it; the same
    answers, headers and options as :class:`~quotad.middleware.RateLimitMiddleware`,
    with a sync :class:`~quotad.Client`. The peer address is ``REMOTE_ADDR``.

    Flask: ``app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, client=..., policy="api")``.
    Django: wrap ``get_wsgi_application()`` in ``wsgi.py`` the same way.
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        client: Client,
        policy: str,
        key: KeyExtractor | None = None,
        cost: Callable[[RequestInfo], int] | None = None,
        ip_prefixes: IpPrefixes | None = None,
        window_secs: int | None = None,
        headers: bool = True,
    ) -> None:
        self.app = app
        self.client = client
        self.options = Options(policy, key, cost, ip_prefixes, window_secs, headers)

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        options = self.options
        request = RequestInfo(
            method=environ.get("REQUEST_METHOD", "GET"),
            path=environ.get("PATH_INFO", "/"),
            headers=_headers(environ),
            peer=environ.get("REMOTE_ADDR") or None,
        )
        key = options.key.extract(request, options.prefixes)
        if key is None:
            if options.key.needs_peer:
                options.log_failure("no peer address on the request", "REMOTE_ADDR is not set")
            return _respond(start_response, _decide.missing_key(options.key.needs_peer))
        try:
            decision = self.client.check(key, options.policy, cost=options.cost(request))
        except QuotadError as error:
            options.log_failure("rate-limit check failed", error)
            return _respond(start_response, _decide.failure(error))
        outcome = _decide.outcome(options.policy, decision, options.window_secs, options.headers)
        if not outcome.passes:
            return _respond(start_response, outcome)
        if not outcome.headers:
            return self.app(environ, start_response)
        names = {n for n, _ in outcome.headers}

        def start_with_headers(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            kept = [(n, v) for n, v in headers if n.lower() not in names]
            return start_response(status, kept + list(outcome.headers), *exc)

        return self.app(environ, start_with_headers)


def _respond(start_response: StartResponse, outcome: _decide.Outcome) -> list[bytes]:
    headers = [*outcome.headers, ("content-length", str(len(outcome.body)))]
    start_response(_STATUS[outcome.status], headers)
    return [outcome.body]
