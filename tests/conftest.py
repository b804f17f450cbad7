"""Hooks for every test (tests/services.py): a test using a fixture that starts a service is
marked for it, and the running test is known to `require`, so a helper that starts a service
can check the test is marked for it."""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests import services


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--check-tier",
        action="store_true",
        help="only the tests that need no engine, Redis, Prometheus or browser (make check)",
    )
    parser.addoption(
        "--service-tier",
        action="store_true",
        help="only the tests that need an engine, Redis, Prometheus or a browser",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        services.mark(item)
    fast, slow = config.getoption("--check-tier"), config.getoption("--service-tier")
    if fast and slow:
        raise pytest.UsageError("--check-tier and --service-tier leave nothing: pick one")
    if fast or slow:
        # --check-tier keeps the tests that need no service, --service-tier the others
        left = [item for item in items if services.needs_a_service(item) == slow]
        dropped = [item for item in items if services.needs_a_service(item) != slow]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = left


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    services.running(item)
    try:
        return (yield)
    finally:
        services.running(None)
