"""Two fake engines and a gateway in front of them with runtime adapters on.

gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")   # admin key: ADMIN
"""

from __future__ import annotations

from pathlib import Path

from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import GatewayServer

ADMIN = "adm-runtime-test"


def gateway_for(make: GatewayFactory, engines: tuple[FakeUpstream, ...], db: Path) -> GatewayServer:
    return make(
        upstream=",".join(engine.url for engine in engines),
        keys_db=str(db),
        admin_keys=(ADMIN,),
        runtime_adapters=True,
        health_interval_s=0.2,
    )
