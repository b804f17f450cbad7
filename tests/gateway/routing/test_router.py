"""The router's policies and rotation, on engines that are never connected to."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from serving.gateway.routing import Engine, Policy, Router
from serving.gateway.routing.prefix_affinity import prefix_hashes
from serving.gateway.routing.router import CONNECT_FAILED, NOT_CHECKED, TIMEOUTS_TO_LEAVE
from serving.gateway.settings import GatewaySettings
from serving.gateway.upstream import UpstreamClient


def router(count: int, policy: Policy = "affinity", overload: int = 2) -> Router:
    urls = ",".join(f"http://10.0.0.{n}:8000" for n in range(1, count + 1))
    settings = GatewaySettings.create(upstream=urls, api_keys=["sk-test"])
    engines = [Engine(UpstreamClient(settings, url)) for url in settings.upstream_urls]
    built = Router(engines, policy=policy, overload=overload)
    for engine in built.engines:
        built.probed(engine, None)
    return built


def conversation(name: str, turn: int) -> list[int]:
    return prefix_hashes("".join(f"[{name} turn {t}] " * 8 for t in range(turn + 1)))


def test_engines_start_out_of_rotation_until_probed() -> None:
    settings = GatewaySettings.create(upstream="http://10.0.0.1:8000", api_keys=["sk-test"])
    engine = Engine(UpstreamClient(settings, settings.upstream))
    fresh = Router([engine], policy="affinity", overload=2)
    assert fresh.choose() is None
    assert fresh.unready_reason == NOT_CHECKED


def test_least_loaded_picks_the_emptiest_and_spreads_ties() -> None:
    routing = router(3, "least-loaded")
    picks = Counter(routing.choose().label for _ in range(9))  # type: ignore[union-attr]
    assert picks == {"10.0.0.1:8000": 3, "10.0.0.2:8000": 3, "10.0.0.3:8000": 3}
    routing.engines[0].in_flight = 2
    routing.engines[1].in_flight = 1
    assert routing.choose() is routing.engines[2]
    routing.engines[2].in_flight = 5
    assert routing.choose() is routing.engines[1]


def test_round_robin_goes_in_turn_whatever_the_load() -> None:
    routing = router(2, "round-robin")
    routing.engines[1].in_flight = 50
    labels = [routing.choose().label for _ in range(4)]  # type: ignore[union-attr]
    assert labels == ["10.0.0.1:8000", "10.0.0.2:8000"] * 2


def test_affinity_keeps_a_conversation_on_its_engine() -> None:
    routing = router(2)
    engines = {name: routing.choose(conversation(name, 0)) for name in ("a", "b")}
    assert engines["a"] is not engines["b"]  # new conversations are spread
    for turn in range(1, 6):
        for name in ("a", "b"):
            assert routing.choose(conversation(name, turn)) is engines[name]


def test_affinity_gives_way_when_its_engine_is_overloaded() -> None:
    routing = router(2, overload=2)
    home = routing.choose(conversation("a", 0))
    assert home is not None
    home.in_flight = 2
    assert routing.choose(conversation("a", 1)) is home  # 2 more than the other: still home
    home.in_flight = 3
    away = routing.choose(conversation("a", 2))
    assert away is not None and away is not home
    home.in_flight = 0
    assert routing.choose(conversation("a", 3)) is away  # the conversation moved with it


def test_an_engine_that_fails_to_connect_leaves_at_once_and_a_probe_brings_it_back() -> None:
    routing = router(2)
    home = routing.choose(conversation("a", 0))
    assert home is not None
    routing.connect_failed(home)
    assert home.reason == CONNECT_FAILED
    other = routing.choose(conversation("a", 1))
    assert other is not None and other is not home
    routing.probed(home, None)
    assert home.in_rotation
    # its prefix memory was dropped (a restarted engine's cache is empty): the conversation
    # stays where it went
    assert routing.choose(conversation("a", 2)) is other


def test_none_in_rotation_means_no_engine_and_says_why() -> None:
    routing = router(2)
    routing.probed(routing.engines[0], "upstream /health answered 503")
    routing.connect_failed(routing.engines[1])
    assert routing.choose(conversation("a", 0)) is None
    assert routing.unready_reason == (
        "no engine in rotation: engine 0: upstream /health answered 503; "
        "engine 1: connecting failed"
    )


@pytest.mark.parametrize("policy", ["affinity", "least-loaded", "round-robin"])
def test_a_failover_target_is_never_the_engine_that_failed(policy: Policy) -> None:
    routing = router(2, policy)
    for _ in range(4):
        first = routing.choose(conversation("a", 0))
        assert first is not None
        assert routing.choose(conversation("a", 0), exclude=first) not in (first, None)
    single = router(1, policy)
    assert single.choose(exclude=single.engines[0]) is None


def test_a_redirect_to_any_engine_becomes_relative() -> None:
    routing = router(2)
    assert routing.gateway_location(b"http://10.0.0.2:8000/v1/models?x=1") == b"/v1/models?x=1"
    assert (
        routing.gateway_location(b"http://10.0.0.9:8000/v1/models")
        == b"http://10.0.0.9:8000/v1/models"
    )


def test_a_slow_health_probe_takes_an_engine_out_only_when_it_keeps_timing_out() -> None:
    routing = router(2)
    engine = routing.engines[0]
    for _ in range(TIMEOUTS_TO_LEAVE - 1):  # busy: vLLM answers /health after its engine core
        routing.probed(engine, "upstream /health timed out", timed_out=True)
        assert engine.in_rotation
    routing.probed(engine, None)  # an answer in time resets the count
    for _ in range(TIMEOUTS_TO_LEAVE - 1):
        routing.probed(engine, "upstream /health timed out", timed_out=True)
    assert engine.in_rotation
    routing.probed(engine, "upstream /health timed out", timed_out=True)
    assert engine.reason == "upstream /health timed out"  # hung: out
    routing.probed(engine, None)
    assert engine.in_rotation
    routing.probed(engine, "upstream /health answered 503")  # an answer that says so: at once
    assert not engine.in_rotation


def test_a_connect_that_times_out_counts_as_a_slow_probe(caplog: pytest.LogCaptureFixture) -> None:
    """A starved host accepts late: the only engine stays in until timeouts repeat (a refused
    connect, above, is out at once), and the log says why it left."""
    routing = router(1)
    (engine,) = routing.engines
    detail = "connecting to the upstream timed out"
    routing.probed(engine, "upstream /health timed out", timed_out=True)
    for _ in range(TIMEOUTS_TO_LEAVE - 2):
        routing.connect_failed(engine, detail, timed_out=True)
        assert routing.choose() is engine
    with caplog.at_level(logging.INFO, logger="serving.gateway.routing.router"):
        routing.connect_failed(engine, detail, timed_out=True)
        assert routing.choose() is None and engine.reason == CONNECT_FAILED
        routing.probed(engine, None)
    assert routing.choose() is engine and engine.timeouts == 0
    assert [r.getMessage() for r in caplog.records if "rotation" in r.getMessage()] == [
        f"engine {engine.label} left the rotation: connecting failed ({detail})",
        f"engine {engine.label} is back in the rotation",
    ]


def test_the_rotation_watcher_hears_every_change_in_the_number_of_engines_in_rotation() -> None:
    """What the fair queue's slots follow (`Fleet.size_queue`): engines that serve requests,
    not every engine known."""
    routing = router(3)
    first, second, third = routing.engines
    heard: list[int] = []
    routing.on_rotation(heard.append)  # told the number at once
    routing.probed(first, "upstream /health answered 503")
    routing.probed(first, "upstream /health answered 503")  # still out: nothing to hear
    routing.connect_failed(second)
    routing.probed(second, None)
    for _ in range(TIMEOUTS_TO_LEAVE - 1):  # slow but still in the rotation
        routing.probed(third, "upstream /health timed out", timed_out=True)
    routing.probed(third, "upstream /health timed out", timed_out=True)
    settings = GatewaySettings.create(upstream="http://10.0.0.9:8000", api_keys=["sk-test"])
    routing.add(Engine(UpstreamClient(settings, settings.upstream)))  # not probed yet: out
    routing.drain(second)
    routing.drain(first)  # out of the rotation already
    assert heard == [3, 2, 1, 2, 1, 0]


def test_a_reaped_engine_s_counters_are_added_to_the_retired_sums() -> None:
    """What the metrics export as one engine, so a sum over engines never goes down."""
    routing = router(2)
    first, second = routing.engines
    for engine, scale in ((first, 1), (second, 10)):
        engine.requests, engine.failovers = 3 * scale, 1 * scale
        engine.accounted_tokens, engine.cut_sequences = 40 * scale, 2 * scale
    routing.drain(first)
    routing.drain(second)
    second.in_flight = 1  # still serving: not reaped yet
    assert routing.reap() == [first]
    second.in_flight = 0
    assert routing.reap() == [second]
    retired = routing.retired
    counts = (retired.requests, retired.failovers, retired.accounted_tokens, retired.cut_sequences)
    assert counts == (33, 11, 440, 22)
