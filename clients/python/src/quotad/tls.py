"""TLS and mTLS settings for an ``https://`` address."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import grpc

from .errors import InvalidAddressError

# A PEM block of each kind: its BEGIN line, some base64, its END line.
_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----")
_KEY = re.compile(rb"-----BEGIN ([A-Z ]*PRIVATE KEY)-----[A-Za-z0-9+/=\s:,-]+-----END \1-----")


@dataclass(frozen=True)
class TLS:
    """How to reach quotad over TLS.

    ``ca``: PEM of the CA that signed quotad's certificate (``None``: the
    public roots bundled with grpcio, not the operating system's). ``cert``
    and ``key``: a client certificate and its key, PEM, for mTLS (both or
    neither). ``server_name``: the name to expect in
    quotad's certificate when it differs from the address's host (e.g. an
    address by IP). Bytes holding no PEM certificate (``ca``, ``cert``) or
    private key (``key``) are refused at once, naming the field.
    """

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidAddressError("tls.cert and tls.key: give both for mTLS, or neither")
        # gRPC would take bytes that hold no certificate and fail only at
        # the first handshake; refuse them here, naming the field.
        for name, marker in (("ca", _CERT), ("cert", _CERT), ("key", _KEY)):
            value = getattr(self, name)
            if value is None:
                continue
            if not isinstance(value, bytes):
                raise InvalidAddressError(
                    f"tls.{name}: PEM bytes expected, got {type(value).__name__}"
                )
            if marker.search(value) is None:
                what = "private key" if name == "key" else "certificate"
                raise InvalidAddressError(f"tls.{name}: no PEM {what} found")

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
