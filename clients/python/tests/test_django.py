"""A Django project's WSGI application behind the WSGI middleware, against a real
quotad: the app's response with the rate-limit fields, then 429s."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import django
import httpx
import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import path
from servers import real_quotad

import quotad
from quotad.middleware import KeyExtractor, WSGIRateLimitMiddleware


def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello from django\n", headers={"x-app": "django"})


urlpatterns = [path("", hello)]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with real_quotad() as q:
        yield q.address


def test_a_django_wsgi_application_behind_the_middleware(server: str) -> None:
    if not settings.configured:
        settings.configure(
            ROOT_URLCONF=__name__, ALLOWED_HOSTS=["app"], SECRET_KEY="test", DEBUG=False
        )
        django.setup()
    from django.core.wsgi import get_wsgi_application

    with quotad.Client(server, deadline=2) as client:
        # What a project's wsgi.py does.
        application = WSGIRateLimitMiddleware(
            get_wsgi_application(),
            client=client,
            policy="login",
            key=KeyExtractor.header("x-api-key"),
        )
        transport = httpx.WSGITransport(app=application, remote_addr="127.0.0.1")
        key = f"dj-{uuid.uuid4().hex[:8]}"
        with httpx.Client(transport=transport, base_url="http://app") as web:
            for remaining in (2, 1, 0):
                ok = web.get("/", headers={"x-api-key": key})
                assert ok.status_code == 200 and ok.text == "hello from django\n"
                assert ok.headers["x-app"] == "django"
                assert ok.headers["x-ratelimit-remaining"] == str(remaining)
            denied = web.get("/", headers={"x-api-key": key})
            assert denied.status_code == 429 and denied.text == "too many requests\n"
            assert int(denied.headers["retry-after"]) >= 1000
            assert web.get("/").status_code == 400
