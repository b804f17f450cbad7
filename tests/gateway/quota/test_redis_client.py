"""The gateway's Redis client against a real redis-server: replies matched first in,
first out also when one is dropped (a timed-out or cancelled call's late reply), every call
bounded, a lost connection failing what waited and the next call opening a new one, a
stalled one given up on, hello (AUTH, SELECT) on unix sockets and TLS, NOSCRIPT reloads,
transactions whole among other callers' commands; and the only Redis client in `serving/`.

Times are bounded, not measured: a call must end well before the bound a busy machine could
stretch, never be waited out.
"""

from __future__ import annotations

import ast
import asyncio
import ssl
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest
import uvloop

from serving.gateway.quota.redis_client import LuaScript, RedisClient, parse_url
from serving.gateway.quota.redis_connection import (
    RedisConnectError,
    RedisConnectionError,
    RedisReplyError,
    RedisTimeoutError,
)
from tests.gateway.quota.redis_server import RedisServer, TlsFiles
from tests.gateway.quota.running import run_async

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")

# Spins inside Redis for ARGV[1] seconds (scripts cannot sleep); Redis answers nothing else
# meanwhile, on any connection.
SPIN = """
local t = redis.call('TIME')
local start = tonumber(t[1]) + tonumber(t[2]) / 1000000
repeat
  t = redis.call('TIME')
until tonumber(t[1]) + tonumber(t[2]) / 1000000 - start >= tonumber(ARGV[1])
return ARGV[2]
"""
# Generous: only bounds how long a broken test hangs, never waited out.
DEADLINE_S = 30.0
SLACK_S = 3.0  # a busy machine's scheduling delay on top of a bound


async def bounded_by(limit_s: float, call: Awaitable[T]) -> T:
    """Await `call`, asserting it ended within `limit_s` plus slack."""
    started = time.monotonic()
    try:
        return await call
    finally:
        assert time.monotonic() - started < limit_s + SLACK_S


@run_async
async def test_a_timed_out_calls_late_reply_is_dropped_and_later_replies_stay_in_place(
    redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(redis_server.url, timeout_s=0.2)
    try:
        # Pipelined on one connection: the slow script, then two quick commands behind it
        # with bounds long enough to wait for it.
        slow = client.call("EVAL", SPIN, 0, "0.6", "slow")
        first = client.call("ECHO", "first", timeout_s=DEADLINE_S)
        second = client.call("ECHO", "second", timeout_s=DEADLINE_S)
        outcomes = await asyncio.gather(slow, first, second, return_exceptions=True)
        assert isinstance(outcomes[0], RedisTimeoutError)
        assert list(outcomes[1:]) == ["first", "second"]  # not "slow", "first"
        assert await client.call("ECHO", "after") == "after"
    finally:
        await client.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_reply_that_came_in_time_wins_over_a_stall_of_the_callers_own_process(
    redis_server: RedisServer, loop: str
) -> None:
    async def scenario() -> object:
        client = RedisClient.from_url(redis_server.url, timeout_s=0.2)
        try:
            assert await client.call("PING") == "PONG"  # connected
            call = asyncio.ensure_future(client.call("ECHO", "in time"))
            await asyncio.sleep(0)  # written at the end of this loop iteration
            await asyncio.sleep(0)
            # This process stalls past the deadline, the reply meanwhile in its socket: the
            # loops read sockets before they run due timers, so the reply wins.
            time.sleep(0.5)
            return await call
        finally:
            await client.close()

    runner = uvloop.run if loop == "uvloop" else asyncio.run
    assert runner(scenario()) == "in time"


@run_async
async def test_a_cancelled_calls_reply_is_dropped_in_its_turn(redis_server: RedisServer) -> None:
    client = RedisClient.from_url(redis_server.url, timeout_s=DEADLINE_S)
    try:
        slow = asyncio.ensure_future(client.call("EVAL", SPIN, 0, "0.3", "slow"))
        behind = asyncio.ensure_future(client.call("ECHO", "behind"))
        await asyncio.sleep(0.05)  # both written
        slow.cancel()
        assert await behind == "behind"
        assert await client.call("ECHO", "next") == "next"
        assert slow.cancelled()
    finally:
        await client.close()


@run_async
async def test_many_concurrent_calls_share_one_connection_and_get_their_own_replies(
    redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(redis_server.url, timeout_s=DEADLINE_S)
    try:
        replies = await asyncio.gather(*(client.call("ECHO", f"n{i}") for i in range(500)))
        assert replies == [f"n{i}" for i in range(500)]
        assert await client.call("CLIENT", "SETNAME", "quota-test") == "OK"
        with redis_server.admin(decode_responses=True) as admin:
            mine = [c for c in admin.client_list() if c["name"] == "quota-test"]
        assert len(mine) == 1
        with pytest.raises(RedisReplyError, match="unknown command"):
            await client.call("NO-SUCH-COMMAND")
        assert await client.call("ECHO", "still fine") == "still fine"
    finally:
        await client.close()


@run_async
async def test_a_lost_connection_fails_what_waited_and_the_next_call_reconnects(
    own_redis: RedisServer,
) -> None:
    client = RedisClient.from_url(own_redis.url, timeout_s=0.5)
    try:
        assert await client.call("SET", "k", "1") == "OK"
        waiting = asyncio.ensure_future(client.call("BLPOP", "nothing", 30, timeout_s=DEADLINE_S))
        await asyncio.sleep(0.1)  # written, blocked in Redis
        own_redis.kill()
        with pytest.raises(RedisConnectionError, match="lost"):
            await bounded_by(0, waiting)
        with pytest.raises(RedisConnectError):  # nothing listens: refused, at once
            await bounded_by(0.5, client.call("PING"))
        own_redis.start()  # empty, on the same port
        assert await client.call("PING") == "PONG"
        assert await client.call("GET", "k") is None
    finally:
        await client.close()


@run_async
async def test_a_black_holed_server_costs_each_call_its_bound_and_a_stalled_connection_is_replaced(
    own_redis: RedisServer,
) -> None:
    client = RedisClient.from_url(own_redis.url, timeout_s=0.2)  # stalled after 1 s of silence
    try:
        old = await client.call("CLIENT", "ID")
        own_redis.pause()
        try:
            started = time.monotonic()
            while time.monotonic() - started < 1.5:
                with pytest.raises(RedisTimeoutError):
                    await bounded_by(0.2, client.call("PING"))
        finally:
            own_redis.resume()
        # The silent connection was given up on: the next call went out on a new one.
        assert await client.call("CLIENT", "ID") != old
        assert await client.call("ECHO", "back") == "back"
    finally:
        await client.close()


@run_async
async def test_scripts_run_by_sha_and_are_sent_in_full_once_redis_forgot_them(
    redis_server: RedisServer,
) -> None:
    script = LuaScript("return 'ran ' .. ARGV[1] .. ' on ' .. KEYS[1]")
    client = RedisClient.from_url(redis_server.url, timeout_s=DEADLINE_S)
    try:
        before = redis_server.commands()
        assert await client.run_script(script, ["k"], ["a"]) == "ran a on k"  # NOSCRIPT, EVAL
        assert await client.run_script(script, ["k"], ["b"]) == "ran b on k"  # EVALSHA
        with redis_server.admin() as admin:
            admin.script_flush()
        assert await client.run_script(script, ["k"], ["c"]) == "ran c on k"
        after = redis_server.commands()
        assert after["eval"] - before.get("eval", 0) == 2
        assert after["evalsha"] - before.get("evalsha", 0) == 3
    finally:
        await client.close()


@run_async
async def test_a_transaction_runs_whole_among_other_callers_commands(
    redis_server: RedisServer,
) -> None:
    client = RedisClient.from_url(redis_server.url, timeout_s=DEADLINE_S)
    key = "counter-" + str(time.monotonic_ns())
    try:
        # The first call opens the connection; the plain INCRs race the transactions on it.
        calls = [client.transaction(("INCR", key), ("INCR", key)) for _ in range(50)]
        calls += [client.call("INCR", key) for _ in range(50)]
        replies = await asyncio.gather(*calls)
        pairs = replies[:50]
        assert all(second == first + 1 for first, second in pairs)  # nothing came between
        assert sorted([n for pair in pairs for n in pair] + replies[50:]) == list(range(1, 151))
        assert await client.transaction() == []
    finally:
        await client.close()


@run_async
async def test_a_transactions_error_replies_are_raised(redis_server: RedisServer) -> None:
    client = RedisClient.from_url(redis_server.url, timeout_s=DEADLINE_S)
    key = "tx-" + str(time.monotonic_ns())
    try:
        # Failed as it ran: raised, and the command before it ran all the same.
        with pytest.raises(RedisReplyError, match="WRONGTYPE"):
            await client.transaction(("SET", key, "x"), ("HSET", key, "f", "v"))
        assert await client.call("GET", key) == "x"
        # Refused as it was queued: raised, and nothing ran (EXECABORT).
        with pytest.raises(RedisReplyError, match="wrong number of arguments"):
            await client.transaction(("SET", key, "y"), ("GET",))
        assert await client.call("GET", key) == "x"
        assert await client.call("ECHO", "still in step") == "still in step"
    finally:
        await client.close()
    with pytest.raises(RedisConnectionError, match="closed"):
        await client.transaction(("PING",))


@pytest.mark.redis
@run_async
async def test_hello_authenticates_and_selects_the_database_on_tcp_and_unix_sockets(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path / "redis", password="s3cret:pw", unix_socket=True)
    server.start()
    try:
        for url in (server.url.replace("/0", "/3"), server.unix_url + "?db=3"):
            client = RedisClient.from_url(url, timeout_s=DEADLINE_S)
            assert await client.call("SET", "where", url[:4]) == "OK"
            await client.close()
        with server.admin(db=3) as admin:
            assert admin.get("where") == b"unix"
        wrong = RedisClient.from_url(server.url.replace("s3cret", "wrong"), timeout_s=DEADLINE_S)
        with pytest.raises(RedisConnectError, match="WRONGPASS") as refused:
            await wrong.call("PING")
        assert "wrong" not in str(refused.value)
        await wrong.close()
    finally:
        server.stop()


@pytest.mark.redis
@run_async
async def test_rediss_speaks_tls_and_checks_the_servers_certificate(tmp_path: Path) -> None:
    tls = TlsFiles.make(tmp_path / "tls")
    server = RedisServer(tmp_path / "redis", password="pw", tls=tls)
    server.start()
    try:
        trusted = RedisClient.from_url(f"{server.tls_url}?ssl_ca_certs={tls.cert}", timeout_s=5)
        assert await trusted.call("PING") == "PONG"
        await trusted.close()
        with_cert = f"{server.tls_url}?ssl_ca_certs={tls.cert}"
        with_cert += f"&ssl_certfile={tls.cert}&ssl_keyfile={tls.key}"  # a client certificate
        presenting = RedisClient.from_url(with_cert, timeout_s=5)
        assert await presenting.transaction(("SET", "tls", "1"), ("GET", "tls")) == ["OK", "1"]
        await presenting.close()
        unverified = RedisClient.from_url(f"{server.tls_url}?ssl_cert_reqs=none", timeout_s=5)
        assert await unverified.call("PING") == "PONG"
        await unverified.close()
        untrusted = RedisClient.from_url(server.tls_url, timeout_s=5)  # system CAs only
        with pytest.raises(RedisConnectError, match="SSLCertVerificationError"):
            await untrusted.call("PING")
        await untrusted.close()
    finally:
        server.stop()


@run_async
async def test_a_closed_client_refuses_calls(redis_server: RedisServer) -> None:
    client = RedisClient.from_url(redis_server.url, timeout_s=DEADLINE_S)
    assert await client.call("PING") == "PONG"
    await client.close()
    with pytest.raises(RedisConnectionError, match="closed"):
        await client.call("PING")


def test_urls_are_read_as_redis_py_reads_them() -> None:
    tcp = parse_url("redis://user:p%40ss@cache.local:7000/5")
    assert (tcp.host, tcp.port, tcp.db, tcp.username, tcp.password) == (
        "cache.local", 7000, 5, "user", "p@ss",
    )  # fmt: skip
    assert tcp.unix_path is None and tcp.tls is None
    assert "p@ss" not in repr(tcp)
    plain = parse_url("redis://redis")
    assert (plain.port, plain.db, plain.password) == (6379, 0, None)
    assert parse_url("redis://:pw@redis:6379/0").username is None
    unix = parse_url("unix://:pw@/run/redis/redis.sock?db=2")
    assert (unix.unix_path, unix.db, unix.password) == ("/run/redis/redis.sock", 2, "pw")
    secure = parse_url("rediss://redis:6380/0?ssl_cert_reqs=none")
    assert secure.tls is not None and not secure.tls.check_hostname
    by_name = parse_url("rediss://redis:6380/0")
    assert by_name.tls is not None and by_name.tls.check_hostname
    assert by_name.tls.verify_mode == ssl.CERT_REQUIRED
    any_name = parse_url("rediss://redis:6380/0?ssl_check_hostname=false")
    assert any_name.tls is not None and not any_name.tls.check_hostname
    assert any_name.tls.verify_mode == ssl.CERT_REQUIRED  # the chain is still checked
    # redis-py's socket and pool options mean nothing here, and are no error
    assert parse_url("redis://redis/2?socket_timeout=5&max_connections=10").db == 2


def test_a_client_certificate_is_read_from_the_urls_files(tmp_path: Path) -> None:
    tls = TlsFiles.make(tmp_path / "tls")
    endpoint = parse_url(f"rediss://:pw@redis/0?ssl_certfile={tls.cert}&ssl_keyfile={tls.key}")
    assert endpoint.tls is not None
    for query in (f"ssl_certfile={tmp_path}/none.pem", f"ssl_ca_certs={tmp_path}/none.pem"):
        with pytest.raises(ValueError, match="cannot read the TLS files") as error:
            parse_url(f"rediss://:pw@redis/0?{query}")
        assert "pw" not in str(error.value)


def test_serving_imports_no_other_redis_client() -> None:
    """One stack: redis-py is the tests' admin client only."""
    root = Path(__file__).resolve().parents[3] / "serving"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "redis" for name in names):
                found.append(f"{path}:{getattr(node, 'lineno', '?')}")
    assert found == []


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://:pw@redis:6379", "redis://, rediss:// or unix://"),
        ("redis://:pw@/0", "needs a host"),
        ("redis://:pw@redis:6379/zero", "database must be a number"),
        ("redis://:pw@redis:port/0", "not a valid Redis URL"),
        ("rediss://:pw@redis/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
    ],
)
def test_bad_urls_say_why_without_the_password(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        parse_url(url)
    assert "pw" not in str(error.value)
