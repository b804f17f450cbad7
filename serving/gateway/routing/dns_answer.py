"""Which addresses of a DNS answer may become engines (`discovery` applies it to each answer;
docs/scale-out.md, engine discovery).

    screen = AnswerScreen(max_engines=64, allow_local=False, own=own_addresses("0.0.0.0"))
    screened = screen.apply(["10.0.0.7", "169.254.169.254"])
    screened.kept       # frozenset({"10.0.0.7"})
    screened.dropped    # {"169.254.169.254": "link-local"}

Whoever answers the name decides where tenants' prompts go, so:
- loopback, unspecified, link-local (cloud metadata at 169.254.169.254) and the gateway's
  own addresses are dropped unless `allow_local`; multicast always is;
- at most `max_engines` are kept (each engine costs a pool, a probe and queue slots): the
  lowest, IPv4 first, so every replica keeps the same ones from the same answer;
- an IPv4-mapped IPv6 address is judged as the IPv4 address it reaches.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import psutil

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# "This network": Python calls only 0.0.0.0 unspecified, but no engine has any of these.
THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
NOT_AN_ADDRESS = "not an IP address"


@dataclass(frozen=True)
class Screened:
    kept: frozenset[str]
    """The addresses that may be engines, as the answer wrote them."""
    dropped: dict[str, str]
    """Each address dropped, with why (for the warning), in `order`."""


class AnswerScreen:
    def __init__(self, *, max_engines: int, allow_local: bool, own: frozenset[IPAddress]) -> None:
        self._max_engines = max_engines
        self._allow_local = allow_local
        self._own = own

    def apply(self, addresses: Iterable[str]) -> Screened:
        kept: list[str] = []
        dropped: dict[str, str] = {}
        for text in sorted(addresses, key=order):
            why = self.why_not(text)
            if why is None and len(kept) == self._max_engines:
                why = f"past the cap of {self._max_engines} engines"
            if why is None:
                kept.append(text)
            else:
                dropped[text] = why
        return Screened(frozenset(kept), dropped)

    def why_not(self, text: str) -> str | None:
        """Why the record `text` may not be an engine; None when it may."""
        try:
            address = reached(ipaddress.ip_address(text))
        except ValueError:
            return NOT_AN_ADDRESS
        if address.is_multicast:
            return "multicast"
        if self._allow_local:
            return None
        if address.is_unspecified or address in THIS_NETWORK:
            return "unspecified"
        if address.is_loopback:
            return "loopback"
        if address.is_link_local:
            return "link-local"
        if address in self._own:
            return "the gateway's own address"
        return None


def order(text: str) -> tuple[int, int, str]:
    """The order addresses are kept in: IPv4 before IPv6, each by number (10.0.0.9 before
    10.0.0.10); a record that is no address last."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return (7, 0, text)
    return (address.version, int(address), "")


def reached(address: IPAddress) -> IPAddress:
    """The address a connection to `address` reaches: an IPv4-mapped IPv6 address's IPv4 one
    (Python 3.11's `is_loopback` and the like do not look through the mapping)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def own_addresses(host: str) -> frozenset[IPAddress]:
    """The addresses the gateway listens on: `host` when it is one address, else (unspecified,
    or a name, which may resolve to any of them) every address of this machine's interfaces."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and not address.is_unspecified:
        return frozenset({reached(address)})
    found: set[IPAddress] = set()
    for interface in psutil.net_if_addrs().values():
        for entry in interface:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                # an IPv6 link-local address comes with its interface: fe80::1%eth0
                found.add(reached(ipaddress.ip_address(entry.address.split("%")[0])))
    return frozenset(found)
