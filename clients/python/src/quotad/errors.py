"""The exceptions a call raises; each carries the gRPC status code and the field quotad named."""

from __future__ import annotations

import re

import grpc

# quotad words a refusal as "<field>: <what is wrong>", the field a path such
# as `cost`, `inline_policy.limit` or `items[3].key`.
_FIELD = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*): "
)


def field_of(message: str) -> str | None:
    """The field a quotad error message names, if it names one."""
    match = _FIELD.match(message)
    return match.group(1) if match else None


class QuotadError(Exception):
    """A call to quotad failed.

    ``code`` is the gRPC status code, ``message`` its details, and ``field``
    the request field quotad named (``"key"``, ``"cost"``,
    ``"items[1].cost"``, ``"inline_policy.limit"``), or ``None``.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        self.field = field_of(message)
        super().__init__(f"{code.name}: {message}")


class RejectedError(QuotadError):
    """quotad refused the request (bad input, unknown policy, not authorized).

    A bug in the caller: never subject to the failure policy.
    """


class UnavailableError(QuotadError):
    """quotad could not be reached, or did not answer within the deadline, and the
    failure policy is :attr:`FailurePolicy.ERROR`."""


class BadResponseError(QuotadError):
    """quotad's answer could not be understood (a server from a newer API)."""

    def __init__(self, message: str) -> None:
        super().__init__(grpc.StatusCode.INTERNAL, message)


class InvalidAddressError(ValueError):
    """The address is not a quotad address, or its TLS settings do not fit it."""
