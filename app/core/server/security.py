"""Safe by default: loopback only, a key off loopback, the Host header checked (DNS rebinding), no CORS unless
origins are listed, and a foreign browser Origin refused (a page must not drive the server with a 'simple'
request that skips the CORS preflight)."""

from __future__ import annotations

import hmac
import ipaddress
import socket

from app.core.errors import HearthError

DEFAULT_PORT = 8080  # `hearth serve`'s and the window's (settings.server_port)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None, allow_network: bool) -> None:
    """Refuse to listen beyond this machine unless asked explicitly and protected by a key."""
    if is_loopback(host):
        return
    if not allow_network:
        raise HearthError(
            f"Refusing to listen on {host}: other machines could use the model. Hearth serves on 127.0.0.1 only, "
            "unless you add --allow-network and an API key (--api-key-name)."
        )
    if not api_key:
        raise HearthError(
            f"Refusing to listen on {host} without an API key: every program on the network could use the model. "
            "Add --api-key-name NAME (the key is kept in the system keyring; --new-key makes one)."
        )


def allowed_host_names(host: str) -> frozenset[str]:
    """Host header names that mean this server: loopback names, the bound address, and, when bound to every
    interface, this machine's name and addresses. Never a wildcard."""
    names = {*LOOPBACK_NAMES, host.strip("[]").lower()}
    if host in ("0.0.0.0", "::", ""):
        names.add(socket.gethostname().lower())
        names.add(socket.getfqdn().lower())
        try:
            import psutil

            for addresses in psutil.net_if_addrs().values():
                for address in addresses:
                    if address.family in (socket.AF_INET, socket.AF_INET6):
                        names.add(address.address.split("%")[0].lower())
        except Exception:  # no interface list: only the names above
            pass
    return frozenset(_canonical(name) for name in names)


def _canonical(name: str) -> str:
    """An IPv6 address in its one short form (as host_name gives it), any other name as it is."""
    try:
        return str(ipaddress.IPv6Address(name))
    except ValueError:
        return name


def host_name(header: str) -> str | None:
    """The name in a Host header, strictly (RFC 9110: host [":" port]): 'example.com:8080' -> 'example.com',
    '[::1]:80' -> '::1'; None for anything else ('[::1]evil.example', 'localhost:1@evil.example', a bare IPv6 address,
    a user part, a path), which then matches no name of this server."""
    header = header.strip().lower()
    if header.startswith("["):
        inside, closed, rest = header[1:].partition("]")
        if not closed or not _is_port_part(rest):
            return None
        try:
            return str(ipaddress.IPv6Address(inside))
        except ValueError:
            return None
    name, colon, port = header.partition(":")
    if colon and not _is_port_part(":" + port):
        return None
    if not name or not all(char.isascii() and (char.isalnum() or char in "-.") for char in name):
        return None
    return name


def _is_port_part(text: str) -> bool:
    """'' or ':' followed by 1-5 digits."""
    return text == "" or (text.startswith(":") and text[1:].isdigit() and 1 <= len(text) - 1 <= 5)


def check_cors_origins(origins: tuple[str, ...], api_key: str | None) -> None:
    """Refuse origins a browser never sends as they are written, '*', and 'null' without a key: every site can make
    its page's origin 'null' (a sandboxed frame), so allowing it without a key allows every site."""
    for origin in origins:
        if origin == "null":
            if not api_key:
                raise HearthError(
                    "--cors-origin null would let every web site call the server (any page can send the origin "
                    "'null' from a sandboxed frame); it is refused unless the server also requires a key "
                    "(--api-key-name)."
                )
            continue
        if origin == "*":
            raise HearthError("--cors-origin takes one page's origin (e.g. http://localhost:3000), not '*'.")
        scheme, sep, rest = origin.partition("://")
        if scheme not in ("http", "https") or not sep or host_name(rest) is None:
            raise HearthError(
                f"--cors-origin {origin[:80]!r} is not an origin: write scheme://host[:port], as the page's address "
                "starts (e.g. http://localhost:3000), with no path."
            )


def key_matches(authorization: str | None, api_key: str) -> bool:
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())
