"""What a test needs beyond Python, named by a pytest marker (pyproject.toml's `markers`):

    engine      the real vLLM engine (CPU build) on the generated model
    redis       a real redis-server
    prometheus  Debian's Prometheus or its promtool
    browser     headless Chromium
    dns         Debian's dnsmasq, answering names the test sets (engine discovery)

`make check` runs every test marked with none of them (`pytest --check-tier`, defined in
tests/conftest.py); `make test` runs all. A helper that starts a service calls
`require(service)` first, and a test that reaches one without its marker fails naming the
marker it lacks: the fast tier can never start a service by accident, and the markers stay
true in every run.

    require("redis")   # in RedisServer.start: fails unless the running test is marked redis
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

import pytest

Service = Literal["engine", "redis", "prometheus", "browser", "dns"]
SERVICES: Final[tuple[Service, ...]] = ("engine", "redis", "prometheus", "browser", "dns")

# Fixtures that start a service: a test using one (directly or through another fixture) is
# marked for it at collection (tests/conftest.py), so the markers follow the fixtures.
FIXTURES: Final[dict[str, Service]] = {
    "redis_server": "redis",
    "own_redis": "redis",
    "persistent_redis": "redis",
    "redis_service": "redis",  # tests/integration/test_k8s_topology.py
    "topology": "redis",  # tests/integration/replicas: three gateways on one Redis
    "promtool": "prometheus",
    "stack": "engine",
    "pooling_stack": "engine",
    "dns_server": "dns",
}


# Every test under tests/integration runs against the real stack.
ENGINE_DIRECTORY: Final = Path(__file__).parent / "integration"


def mark(item: pytest.Item) -> None:
    """Add the markers a test's fixtures and place imply (tests/conftest.py, at collection)."""
    needs = {FIXTURES[name] for name in getattr(item, "fixturenames", ()) if name in FIXTURES}
    if ENGINE_DIRECTORY in Path(str(item.fspath)).parents:
        needs.add("engine")
    for service in sorted(needs):
        item.add_marker(service)


def needs_a_service(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(service) is not None for service in SERVICES)


# The test being run (tests/conftest.py sets it around each test, fixtures included).
_current: list[pytest.Item] = []


def running(item: pytest.Item | None) -> None:
    _current[:] = [] if item is None else [item]


def require(service: Service) -> None:
    """Fail the running test unless it is marked `service`."""
    if _current and _current[0].get_closest_marker(service) is None:
        pytest.fail(
            f"{_current[0].nodeid} starts {service} but is not marked @pytest.mark.{service} "
            "(tests/services.py): mark it, so `make check` leaves it out",
            pytrace=False,
        )
