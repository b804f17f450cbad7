"""The local ports the stack listens on unless told otherwise, written once.

The gateway listens on `GATEWAY_PORT`, the first engine on `ENGINE_PORT` (engine i on
`ENGINE_PORT + 2i`), and each engine's launcher metrics on its engine port + 1
(`serving/engine/command.py`). `serving up` opens the gateway's metrics port (every series,
each key's spend too; the API port has the aggregate ones) on `GATEWAY_METRICS_PORT`:
above the 16 engines and launchers `--replicas` may start (8001-8032), and below the
ephemeral ports the tests take (32768+), so neither lands on it. The Makefile reads them
from here. Prometheus's local config (monitoring/prometheus/prometheus.yml) spells them
again, checked against these by a test and rewritten by `make monitor` for other ports; the
Kubernetes manifests' ports are the pods' own (the engine listens on 8000 in its pod, the
gateway's metrics on 9100), another fact.
"""

from __future__ import annotations

from typing import Final

GATEWAY_PORT: Final = 8000
ENGINE_PORT: Final = 8001
GATEWAY_METRICS_PORT: Final = 8100
