"""The middlewares inside real frameworks (Starlette/FastAPI, Flask) against a real
quotad: the app's own response and headers kept, the rate-limit fields added, the
edge cases the shared cases do not reach."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import flask
import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from servers import real_quotad
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

import quotad
from quotad.middleware import KeyExtractor, RateLimitMiddleware, WSGIRateLimitMiddleware


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with real_quotad() as q:
        yield q.address


def key() -> str:
    return f"mw-{uuid.uuid4().hex[:8]}"


def starlette_app(address: str, **options: Any) -> Starlette:
    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse(
            "hello\n", headers={"x-app": "kept", "x-ratelimit-limit": "from the app"}
        )

    async def echo(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text("no limit on websockets")
        await ws.close()

    app = Starlette(routes=[Route("/", hello), WebSocketRoute("/ws", echo)])
    options.setdefault("key", KeyExtractor.header("x-api-key"))
    app.add_middleware(
        RateLimitMiddleware,
        client=lambda: quotad.AsyncClient(address, deadline=2),
        policy="login",
        **options,
    )
    return app


def test_an_allowed_response_is_the_apps_with_the_rate_limit_fields(server: str) -> None:
    with TestClient(starlette_app(server)) as web:
        k = key()
        response = web.get("/", headers={"x-api-key": k})
        assert response.status_code == 200 and response.text == "hello\n"
        assert response.headers["x-app"] == "kept"
        # The layer's fields replace the app's own of the same name.
        assert response.headers.get_list("x-ratelimit-limit") == ["3"]
        assert response.headers["ratelimit"].startswith('"login";r=2;t=')
        for _ in range(2):
            web.get("/", headers={"x-api-key": k})
        denied = web.get("/", headers={"x-api-key": k})
        assert denied.status_code == 429 and denied.text == "too many requests\n"
        assert denied.headers["content-type"] == "text/plain; charset=utf-8"
        assert 1000 <= int(denied.headers["retry-after"]) <= 1202
        assert "x-app" not in denied.headers


def test_websockets_and_lifespan_pass_through_unchecked(server: str) -> None:
    with TestClient(starlette_app(server)) as web, web.websocket_connect("/ws") as ws:
        assert ws.receive_text() == "no limit on websockets"


def test_a_key_quotad_refuses_is_400_and_a_missing_peer_is_500(server: str) -> None:
    with TestClient(starlette_app(server)) as web:
        too_long = web.get("/", headers={"x-api-key": "k" * 1000})
        assert too_long.status_code == 400 and too_long.text == "invalid rate-limit key\n"

    async def no_peer() -> httpx.Response:
        app = starlette_app(server, key=KeyExtractor.peer_ip())
        transport = httpx.ASGITransport(app=app, client=None)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as web:
            return await web.get("/")

    response = asyncio.run(no_peer())
    assert response.status_code == 500 and response.text == "rate limiter misconfigured\n"


def test_the_cost_function_and_the_window_reach_the_check_and_the_headers(server: str) -> None:
    app = starlette_app(server, cost=lambda r: 2 if r.path == "/" else 1, window_secs=3600)
    with TestClient(app) as web:
        response = web.get("/", headers={"x-api-key": key()})
        assert response.headers["x-ratelimit-remaining"] == "1"
        assert response.headers["ratelimit-policy"] == '"login";q=3;w=3600'


def test_headers_off_leaves_the_fields_out_but_a_429_keeps_retry_after(server: str) -> None:
    with TestClient(starlette_app(server, headers=False)) as web:
        k = key()
        for _ in range(3):
            ok = web.get("/", headers={"x-api-key": k})
            assert ok.status_code == 200 and "ratelimit" not in ok.headers
            assert ok.headers["x-ratelimit-limit"] == "from the app"
        denied = web.get("/", headers={"x-api-key": k})
        assert denied.status_code == 429 and "ratelimit" not in denied.headers
        assert denied.headers["retry-after"].isdigit()


def test_fastapi_takes_the_middleware_as_any_starlette_middleware(server: str) -> None:
    app = FastAPI()

    @app.get("/items/{item}")
    def item(item: int) -> dict[str, int]:
        return {"item": item}

    app.add_middleware(
        RateLimitMiddleware,
        client=lambda: quotad.AsyncClient(server, deadline=2),
        policy="login",
        key=KeyExtractor.header("x-api-key"),
    )
    with TestClient(app) as web:
        k = key()
        statuses = [web.get("/items/7", headers={"x-api-key": k}).status_code for _ in range(5)]
        assert statuses == [200, 200, 200, 429, 429]
        assert web.get("/items/7", headers={"x-api-key": k + "b"}).json() == {"item": 7}


def test_flask_behind_the_wsgi_middleware(server: str) -> None:
    app = flask.Flask(__name__)

    @app.get("/")
    def hello() -> flask.Response:
        response = flask.make_response("hello\n")
        response.headers["x-app"] = "kept"
        return response

    client = quotad.Client(server, deadline=2)
    app.wsgi_app = WSGIRateLimitMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, client=client, policy="by_ip", key=KeyExtractor.peer_ip()
    )
    web = app.test_client()
    peer = f"198.51.100.{uuid.uuid4().int % 250 + 1}"
    first = web.get("/", environ_base={"REMOTE_ADDR": peer})
    assert first.status_code == 200 and first.headers["x-app"] == "kept"
    assert first.headers["x-ratelimit-remaining"] == "1"
    web.get("/", environ_base={"REMOTE_ADDR": peer})
    denied = web.get("/", environ_base={"REMOTE_ADDR": peer})
    assert denied.status_code == 429 and denied.headers["x-ratelimit-remaining"] == "0"
    assert int(denied.headers["retry-after"]) >= 1000
    # REMOTE_ADDR missing: a setup error, never a shared budget.
    assert web.get("/", environ_base={"REMOTE_ADDR": ""}).status_code == 500
    client.close()
