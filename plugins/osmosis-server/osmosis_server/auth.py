"""Bearer-token authentication of the rollout server: a small pure-ASGI middleware.

Every route needs ``Authorization: Bearer <token>`` except ``GET /livez`` (a bare liveness probe
that says nothing about the server). The token is compared in constant time. With
authentication turned off (``--no-auth``, ``create_app(auth=False)``) the server answers only
connections made to a loopback address, however it was bound: a server reachable from the network
always has a token.

>>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("localhost"), is_loopback("0.0.0.0")
(True, True, True, False)
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

__all__ = ["LIVEZ", "BearerAuth", "generate_token", "is_loopback"]

LIVEZ: Final = "/livez"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_UNAUTHORIZED: Final = b'{"detail":"unauthorized: send Authorization: Bearer <token>"}'
_LOOPBACK_ONLY: Final = b'{"detail":"authentication is off, so only loopback connections are served"}'


def generate_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


@functools.lru_cache(maxsize=256)
def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is on the loopback interface."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


async def _refuse(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BearerAuth:
    """ASGI middleware: a bearer token on every HTTP route but :data:`LIVEZ`.

    :param token: the token; ``None`` turns authentication off (loopback connections only).
    """

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self._expected = None if token is None else b"Bearer " + token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == LIVEZ:
            await self.app(scope, receive, send)
            return
        expected = self._expected
        if expected is None:
            server = scope.get("server")
            if server is not None and not is_loopback(str(server[0])):
                await _refuse(send, 403, _LOOPBACK_ONLY, [])
                return
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                given = value
                break
        if not hmac.compare_digest(given, expected):
            await _refuse(send, 401, _UNAUTHORIZED, [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)
