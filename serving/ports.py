"""The local ports the stack listens on unless told otherwise, written once.

The gateway listens on `GATEWAY_PORT`, the first engine on `ENGINE_PORT` (engine i on
`ENGINE_PORT + 2i`), and each engine's launcher metrics on its engine port + 1
(`serving/engine/command.py`). The Makefile, monitoring/prometheus/prometheus.yml and the
Kubernetes manifests are not Python and spell them again (docs/architecture.md, where state lives).
"""

from __future__ import annotations

from typing import Final

GATEWAY_PORT: Final = 8000
ENGINE_PORT: Final = 8001
