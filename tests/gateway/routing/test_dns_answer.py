"""What of a DNS answer may become an engine: addresses that point back at the gateway's own
machine or its link are dropped unless allowed, multicast always, and at most
`max_engines` addresses are kept, the same ones whatever order the records came in."""

from __future__ import annotations

import ipaddress
import random

import pytest

from serving.gateway.routing.dns_answer import AnswerScreen, own_addresses

OWN = own_addresses("10.0.0.5")
ENGINES = ("10.0.0.7", "10.0.0.8", "fd00::7")


def screen(*, max_engines: int = 64, allow_local: bool = False) -> AnswerScreen:
    return AnswerScreen(max_engines=max_engines, allow_local=allow_local, own=OWN)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"),
        ("127.0.0.2", "loopback"),
        ("::1", "loopback"),
        # Python 3.11's checks do not see through a mapped address; connect() does
        ("::ffff:127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),  # the cloud metadata server
        ("169.254.0.1", "link-local"),
        ("fe80::1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("10.0.0.5", "the gateway's own address"),
    ],
)
def test_an_address_that_is_not_a_remote_engine_is_dropped_saying_why(
    address: str, why: str
) -> None:
    screened = screen().apply([*ENGINES, address])
    assert screened.kept == frozenset(ENGINES)
    assert screened.dropped == {address: why}


def test_allow_local_keeps_loopback_link_local_unspecified_and_own_but_never_multicast() -> None:
    local = ["127.0.0.2", "::1", "169.254.1.1", "fe80::1", "0.0.0.0", "::", "10.0.0.5"]
    screened = screen(allow_local=True).apply([*local, "224.0.0.1", "ff02::1"])
    assert screened.kept == frozenset(local)
    assert screened.dropped == {"224.0.0.1": "multicast", "ff02::1": "multicast"}


def test_past_the_cap_the_lowest_addresses_are_kept_whatever_the_order() -> None:
    answer = [f"10.2.{n // 256}.{n % 256}" for n in range(1000)] + ["fd00::1", "fd00::2"]
    first, second = answer[:], answer[:]
    random.Random(1).shuffle(first)
    random.Random(2).shuffle(second)
    screened = screen(max_engines=64).apply(first)
    # numeric order, IPv4 first: 10.2.0.100 comes after 10.2.0.99, not after 10.2.0.10
    assert screened.kept == frozenset(answer[:64])
    assert screen(max_engines=64).apply(second) == screened
    assert len(screened.dropped) == len(answer) - 64
    assert set(screened.dropped.values()) == {"past the cap of 64 engines"}


def test_dropped_addresses_do_not_count_against_the_cap() -> None:
    screened = screen(max_engines=2).apply(["127.0.0.1", "0.0.0.0", "10.0.0.9", "10.0.0.8"])
    assert screened.kept == frozenset({"10.0.0.8", "10.0.0.9"})
    assert set(screened.dropped) == {"127.0.0.1", "0.0.0.0"}


def test_a_record_that_is_no_address_is_dropped() -> None:
    assert screen().apply(["10.0.0.7", "engine.example"]).dropped == {
        "engine.example": "not an IP address"
    }


def test_own_addresses_are_the_listening_address_or_every_one_of_this_machine() -> None:
    assert own_addresses("10.0.0.5") == frozenset({ipaddress.ip_address("10.0.0.5")})
    for host in ("0.0.0.0", "::", "localhost"):
        mine = own_addresses(host)
        assert ipaddress.ip_address("127.0.0.1") in mine, host  # every machine has loopback
        assert all(address.version in (4, 6) for address in mine)
