"""A FastAPI app whose /api routes are rate limited by quotad.

    pip install ./clients/python fastapi uvicorn
    quotad serve -c examples/fastapi/quotad.toml &
    QUOTAD_ADDR=http://127.0.0.1:50051 uvicorn app:app --app-dir examples/fastapi

Each API key (the ``x-api-key`` header) gets the ``api`` policy's budget;
past it the app answers 429 with ``Retry-After`` and the ``RateLimit``
fields. If quotad is unreachable the requests pass (fail open).
"""

from __future__ import annotations

import os

import quotad
from fastapi import FastAPI
from quotad.middleware import KeyExtractor, RateLimitMiddleware


def create_app(address: str) -> FastAPI:
    app = FastAPI(title="quotad example")

    @app.get("/api/hello")
    def hello() -> dict[str, str]:
        return {"hello": "world"}

    app.add_middleware(
        RateLimitMiddleware,
        # Made on the first request, inside the server's event loop.
        client=lambda: quotad.AsyncClient(
            address, deadline=0.25, on_unavailable="fail_open"
        ),
        policy="api",
        key=KeyExtractor.header("x-api-key"),
    )
    return app


app = create_app(os.environ.get("QUOTAD_ADDR", "http://127.0.0.1:50051"))
