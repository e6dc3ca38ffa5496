"""Client for quotad, the rate-limit and quota state owner.

Sync :class:`Client` and asyncio :class:`AsyncClient` with ``check``,
``check_batch``, ``peek`` and ``reset``; a per-call deadline and a failure
policy applied within it; TLS and mTLS; a local deny cache. Rate-limit
middleware for ASGI (Starlette, FastAPI) and WSGI (Flask, Django) apps is in
:mod:`quotad.middleware`. Every answer is the Rust client's
(``quotad-client``), held to it by the shared conformance cases in the
repository's ``tests/clients/``.

>>> import quotad                                                # doctest: +SKIP
>>> client = quotad.Client("http://127.0.0.1:50051", on_unavailable="fail_open")
>>> d = client.check("user-42", "api")
>>> d.allowed, d.remaining, d.retry_after_ms
(True, 99, 0)
"""

from ._coalesce import Coalescing, CoalescingStats
from ._deny_cache import DEFAULT_DENY_CACHE_CAPACITY
from ._lease import LeaseOptions, LeaseStats
from ._settings import DEFAULT_DEADLINE
from ._types import (
    Algorithm,
    BatchMode,
    Check,
    Decision,
    FailurePolicy,
    LeaseTerms,
    Policy,
    PolicyLike,
    Reason,
)
from .aio import AsyncClient
from .client import Client
from .errors import (
    BadResponseError,
    InvalidAddressError,
    QuotadError,
    RejectedError,
    UnavailableError,
)
from .tls import TLS

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_DENY_CACHE_CAPACITY",
    "TLS",
    "Algorithm",
    "AsyncClient",
    "BadResponseError",
    "BatchMode",
    "Check",
    "Client",
    "Coalescing",
    "CoalescingStats",
    "Decision",
    "FailurePolicy",
    "InvalidAddressError",
    "LeaseOptions",
    "LeaseStats",
    "LeaseTerms",
    "Policy",
    "PolicyLike",
    "QuotadError",
    "Reason",
    "RejectedError",
    "UnavailableError",
]
