"""TLS and mTLS settings for an ``https://`` address."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from .errors import InvalidAddressError


@dataclass(frozen=True)
class TLS:
    """How to reach quotad over TLS.

    ``ca``: PEM of the CA that signed quotad's certificate (``None``: the
    system's roots). ``cert`` and ``key``: a client certificate and its key,
    PEM, for mTLS (both or neither). ``server_name``: the name to expect in
    quotad's certificate when it differs from the address's host (e.g. an
    address by IP).
    """

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidAddressError("tls.cert and tls.key: give both for mTLS, or neither")

    @classmethod
    def from_pem_files(
        cls,
        ca: str | Path | None = None,
        *,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
    ) -> TLS:
        """The same, read from PEM files."""

        def read(path: str | Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return cls(ca=read(ca), cert=read(cert), key=read(key), server_name=server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )
