"""A start refuses a port that something already listens on, naming what holds it."""

from __future__ import annotations

import os
import socket

import pytest

from serving.engine.port_check import listener, refuse_taken
from serving.errors import ServingError
from tests.ports import free_port


def test_a_port_held_by_a_listener_is_refused_with_its_pid_and_command_line() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServingError) as refused:
            refuse_taken(
                {free_port(): "the gateway's (--port)", port: "an engine's (--engine-port)"}
            )
    message = str(refused.value)
    assert message.startswith(f"an engine's (--engine-port) port {port} is already in use by PID ")
    assert f"PID {os.getpid()} (" in message and "pytest" in message
    assert message.endswith("stop it first")


def test_free_ports_pass() -> None:
    refuse_taken({free_port(): "the gateway's (--port)", free_port(): "an engine's"})


def test_a_listener_on_another_address_of_the_same_port_is_not_the_owner() -> None:
    """Engine discovery's test runs two engines on one port, at 127.0.0.1 and 127.0.0.2."""
    with socket.socket() as other:
        other.bind(("127.0.0.2", 0))
        other.listen()
        port = other.getsockname()[1]
        assert listener(port, "127.0.0.1") is None
        assert listener(port, "127.0.0.2") == os.getpid()
        assert listener(port) == os.getpid()
