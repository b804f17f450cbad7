"""Scale-out with real processes: `serving up --replicas 2`, gateway replicas sharing Redis,
and the faults they must survive (issue 11 part 4; docs/architecture.md, reliability cases
2, 6, 7, 11, 12, 13 and 18).

One topology for this package (`scale_out.scale_out_topology`, a package fixture: it is
started by the first test that needs it and gone when the package is done), started as a
user starts it:
- `serving up --replicas 2 --routing least-loaded`: two supervised vLLM CPU engines on the
  tiny model (they load side by side) and its own gateway (quotas in its process);
- one real `redis-server`;
- three more `serving gateway` replicas over the same two engines, sharing Redis
  (`--redis-replicas 3`) and the keys.db of `serving up` (keys made with `serving keys
  create --store`), each with a part to play besides being a replica:
    r0  fails closed, drains 2 s: the engine kill is driven through it, then it gets SIGTERM;
    r1  fails closed, 10 s lease TTL: SIGKILLed holding leases, which must expire;
    r2  fails local: serves a share of each limit while Redis is away; engines are frozen
        under it (it gives /health 4 s; the others 10 s, which busy vLLM needs here);
  and, for one test, r3: a replica that dies after Redis came back empty.

No fakes: every engine is vLLM, every client the official `openai` client or raw httpx where
the wire itself is checked (SSE events, status and headers). The churn at volume, which
needs a fast fake upstream, is test_churn.py (no topology of its own here).

Holding a request in flight on purpose: the tiny model makes 1,800 tokens in one to ten
seconds here, so a test that needs a stream still running while it checks something freezes
the engine (SIGSTOP to the vLLM server, `EngineControl`) as the stream's first tokens arrive,
and thaws it after: an engine busy for that long.

The tests run in file order and share the processes: test_routing_and_limits.py first, then
test_survives_faults.py, whose tests kill things, in the order they need them; and the
engine kill waits for the supervisor's restart before it ends.
Measured on the shared 2-core machine: 3 min 20 s quiet, 5 min busy; starting everything
takes 40-115 s (the engines load side by side), the engine kill 60-115 s (40-90 s of it the
supervisor's restart).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.scale_out import Topology, scale_out_topology


@pytest.fixture(scope="package")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    with scale_out_topology(tmp_path_factory.mktemp("scale-out")) as topology:
        yield topology
