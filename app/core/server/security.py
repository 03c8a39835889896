"""Safe by default: loopback only, a key off loopback, the Host header checked (DNS rebinding), no CORS unless
origins are listed, and a foreign browser Origin refused (a page must not drive the server with a 'simple'
request that skips the CORS preflight)."""

from __future__ import annotations

import hmac
import ipaddress
import socket

from app.core.errors import HearthError

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
    return frozenset(names)


def host_name(header: str) -> str:
    """'example.com:8080' -> 'example.com'; '[::1]:80' -> '::1'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:
        return header.partition(":")[0]
    return header


def key_matches(authorization: str | None, api_key: str) -> bool:
    if not authorization:
        return False
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())
