"""A real DNS server for the engine-discovery tests: Debian's dnsmasq on a loopback port,
answering the names a test sets from a hosts file it rewrites (SIGHUP re-reads it).

    with DnsServer(tmp_path) as dns:                  # dnsmasq on 127.0.0.1:<free port>
        dns.set("engines.serving.test", ["127.0.0.2"])
        dns.nameserver                                # "127.0.0.1:PORT": --dns-nameserver
        dns.pause() ... dns.resume()                  # SIGSTOP/SIGCONT: queries time out

Names under `DOMAIN` are answered from the file alone: a name with no address there gets
NXDOMAIN, as a Kubernetes headless Service with no ready pod does. Answers carry a TTL of
one second (`--local-ttl`), so the gateway looks again every second.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import dns.resolver
import pytest

from tests.gateway.servers import closed_port
from tests.services import require

DOMAIN = "serving.test"
START_S = 10.0


class DnsServer:
    def __init__(self, directory: Path) -> None:
        binary = shutil.which("dnsmasq") or (
            "/usr/sbin/dnsmasq" if Path("/usr/sbin/dnsmasq").exists() else None
        )
        if binary is None:
            pytest.fail("dnsmasq is missing: `make system-deps` installs Debian's dnsmasq-base")
        self._binary = binary
        self._hosts = directory / "dns-hosts"
        self._log = directory / "dnsmasq.log"
        self._names: dict[str, list[str]] = {}
        self.port = closed_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        require("dns")
        self._hosts.write_text("")
        argv = [
            self._binary, "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
            "--no-hosts", f"--addn-hosts={self._hosts}", f"--local=/{DOMAIN}/",
            "--local-ttl=1", "--listen-address=127.0.0.1", "--bind-interfaces",
            f"--port={self.port}", "--pid-file=", f"--log-facility={self._log}",
        ]  # fmt: skip
        if os.geteuid() == 0:
            argv.append("--user=root")  # else it drops to `nobody`, who cannot read tmp_path
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + START_S
        while not self._answers():
            if self._process.poll() is not None:
                stderr = self._process.stderr.read().decode() if self._process.stderr else ""
                pytest.fail(f"dnsmasq exited at start: {stderr.strip()}")
            if time.monotonic() > deadline:
                pytest.fail(f"dnsmasq did not answer on {self.nameserver} in {START_S} s")
            time.sleep(0.1)

    def set(self, name: str, addresses: Sequence[str]) -> None:
        """`name` answers `addresses` from now on (none: NXDOMAIN)."""
        self._names[name] = list(addresses)
        lines = [f"{address} {host}" for host, found in self._names.items() for address in found]
        self._hosts.write_text("".join(f"{line}\n" for line in lines))
        self._signal(signal.SIGHUP)
        # dnsmasq re-reads the file after the signal: wait until it answers the new set
        deadline = time.monotonic() + START_S
        while sorted(self.lookup(name)) != sorted(addresses):
            assert time.monotonic() < deadline, f"dnsmasq still answers the old {name}"
            time.sleep(0.05)

    def lookup(self, name: str, lifetime_s: float = 2.0) -> list[str]:
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = (
            ["127.0.0.1"],
            self.port,
            lifetime_s,
        )
        try:
            answer = resolver.resolve(name, "A", raise_on_no_answer=False)
        except dns.resolver.NXDOMAIN:
            return []
        return [] if answer.rrset is None else [rdata.to_text() for rdata in answer.rrset]

    def pause(self) -> None:
        """Queries go unanswered (time out) until `resume`: a DNS outage."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.send_signal(signal.SIGCONT)
            process.terminate()
            process.wait(10)

    def _answers(self) -> bool:
        try:
            # A query sent before dnsmasq listens is lost, not refused: a short wait per
            # try, or each start waits out a whole lifetime.
            self.lookup(f"probe.{DOMAIN}", lifetime_s=0.2)
        except dns.exception.DNSException:
            return False
        return True

    def _signal(self, signum: int) -> None:
        assert self._process is not None, "dnsmasq not started"
        self._process.send_signal(signum)

    def __enter__(self) -> DnsServer:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
