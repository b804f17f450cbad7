"""Addresses in the gateway's settings: the upstream (engines' URLs, or a `dns+` URL whose
name lists them) and a DNS server's `IP[:PORT]`.

    check_upstream("http://127.0.0.1:8001/,http://127.0.0.1:8003")   # without the slash
    check_upstream("dns+http://engine-headless:8000")                 # discovery
    parse_nameserver("10.0.0.10:5353")                                # ("10.0.0.10", 5353)

Each raises `ValueError` with the reason only (pydantic adds the field's name).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

DNS_PORT = 53
# An upstream whose host is a DNS name listing the engines (discovery), not one engine.
DNS_PREFIX = "dns+"


def parse_nameserver(value: str) -> tuple[str, int]:
    """`IP`, `IP:PORT` or `[IPv6]:PORT` to (ip, port); ValueError says what is wrong."""
    host, port = value, DNS_PORT
    try:
        if value.startswith("["):
            host, _, rest = value[1:].partition("]")
            port = int(rest.removeprefix(":")) if rest else DNS_PORT
        elif value.count(":") == 1:
            host, _, text = value.partition(":")
            port = int(text)
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError("must be an IP address, optionally with :PORT") from None
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of range")
    return host, port


def check_upstream(value: str) -> str:
    """One `dns+` URL, or engines' URLs comma-separated (each once), without trailing slashes."""
    if value.strip().startswith(DNS_PREFIX):
        return DNS_PREFIX + check_upstream_url(value.strip()[len(DNS_PREFIX) :])
    urls = [check_upstream_url(url.strip()) for url in value.split(",")]
    if len(set(urls)) != len(urls):
        raise ValueError("lists an engine twice")
    return ",".join(urls)


def check_upstream_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError("must not carry credentials, a query or fragment")
    if port == 0:
        raise ValueError("has port 0")
    return url.rstrip("/")
