"""One exception tree: every exception class the gateway defines derives from
`GatewayException` and is named in the tree that `serving/gateway/failures.py` draws."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import serving.gateway
from serving.gateway import failures
from serving.gateway.errors import GatewayError
from serving.gateway.failures import GatewayException


def defined_exceptions() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    prefix = serving.gateway.__name__ + "."
    for info in pkgutil.walk_packages(serving.gateway.__path__, prefix):
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found.append(value)
    return found


def test_every_exception_the_gateway_defines_is_in_the_one_tree() -> None:
    exceptions = defined_exceptions()
    assert len(exceptions) > 30  # the walk found the modules
    outside = [e.__qualname__ for e in exceptions if not issubclass(e, GatewayException)]
    assert outside == []
    tree = failures.__doc__ or ""
    internal = [
        e for e in exceptions if not issubclass(e, GatewayError) and e is not GatewayException
    ]
    unnamed = [e.__qualname__ for e in internal if f" {e.__name__} " not in tree]
    assert unnamed == [], "draw them in serving/gateway/failures.py"
