"""Rate-limit middleware for ASGI (Starlette, FastAPI) and WSGI (Flask, Django) apps,
answering as the Rust ``RateLimitLayer``: the same key choices, trusted-proxy rules,
statuses and headers."""

from ._decide import retry_after_secs
from ._keys import IpPrefixes, KeyExtractor, RequestInfo
from .asgi import RateLimitMiddleware
from .wsgi import WSGIRateLimitMiddleware

__all__ = [
    "IpPrefixes",
    "KeyExtractor",
    "RateLimitMiddleware",
    "RequestInfo",
    "WSGIRateLimitMiddleware",
    "retry_after_secs",
]
