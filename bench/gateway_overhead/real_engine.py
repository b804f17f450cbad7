"""The same load against a running vLLM, directly and through a running gateway.

    python -m bench.gateway_overhead --real-engine http://127.0.0.1:8001 \\
        --gateway-url http://127.0.0.1:8000 --api-key "$KEY"

Nothing is started here: the engine and the gateway are the caller's (the gateway pointed at
that engine). Short chats with `max_tokens` 16 and vLLM's `ignore_eos`, so every response
has exactly 16 tokens on both paths; the two paths are measured interleaved, and the report
gives the gateway's throughput as a share of direct (docs/architecture.md, performance
targets: >= 98%).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from bench.gateway_overhead import report
from bench.gateway_overhead.load import REQUEST_TIMEOUT_S, Target, probe
from bench.gateway_overhead.paths import PathUnderTest
from bench.gateway_overhead.processes import BenchError
from bench.gateway_overhead.runner import Plan, run_rounds
from bench.results_files import loadavg, machine

Json = dict[str, object]
MAX_TOKENS = 16


@dataclass(frozen=True, kw_only=True)
class RealOptions:
    engine_url: str
    gateway_url: str
    api_key: str
    """The gateway key."""
    engine_api_key: str = ""
    """vLLM's own `--api-key`, when it has one."""
    model: str = ""
    """Served model name; default: the engine's first model."""
    plan: Plan
    command: str = ""


async def discover_model(engine_url: str, api_key: str) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    url = engine_url.rstrip("/") + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(url, headers=headers) as response,
        ):
            data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise BenchError(f"--real-engine: GET {url} failed: {exc}") from exc
    models = data.get("data") if isinstance(data, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise BenchError(f"--real-engine: {url} lists no model: {str(data)[:200]}")
    return str(models[0]["id"])


async def run_real(options: RealOptions, log: Callable[[str], None]) -> Json:
    loadavg_before = loadavg()
    model = options.model or await discover_model(options.engine_url, options.engine_api_key)
    extra = {"ignore_eos": True}
    direct = PathUnderTest(
        name="direct",
        label="direct to vLLM",
        target=Target(
            base_url=options.engine_url,
            api_key=options.engine_api_key or "EMPTY",
            model=model,
            max_tokens=MAX_TOKENS,
            extra=extra,
        ),
    )
    gateway = PathUnderTest(
        name="gateway",
        label="through our gateway",
        target=Target(
            base_url=options.gateway_url,
            api_key=options.api_key,
            model=model,
            max_tokens=MAX_TOKENS,
            extra=extra,
        ),
    )
    for path in (direct, gateway):
        failure = await probe(path.target)
        if failure is not None:
            raise BenchError(f"{path.label} ({path.target.base_url}): {failure}")
    log(f"model {model}: measuring direct and through the gateway, interleaved ...")
    samples = await run_rounds([direct, gateway], options.plan, cpu_groups=lambda _: {}, log=log)
    summaries = {name: report.summarise(per_metric) for name, per_metric in samples.items()}
    share = {
        key: _share(summaries["gateway"][key], summaries["direct"][key])
        for key in ("req_per_s", "streams_per_s", "chunks_per_s")
    }
    targets = [
        report.real_target(share["req_per_s"], "req/s (JSON)"),
        report.real_target(share["streams_per_s"], "streams/s"),
    ]
    errors = [n for n, s in summaries.items() if s["errors"]]
    doc: Json = {
        "benchmark": "gateway_overhead",
        "mode": "real-engine",
        "created": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "command": options.command,
        "machine": {**machine(), "loadavg_before": loadavg_before, "loadavg_after": loadavg()},
        "model": model,
        "max_tokens": MAX_TOKENS,
        "plan": options.plan.describe(),
        "paths": {
            path.name: {
                "label": path.label,
                "url": path.target.base_url,
                "summary": summaries[path.name],
            }
            for path in (direct, gateway)
        },
        "share_of_direct": share,
        "targets": targets,
        "notes": [f"errors on: {', '.join(errors)}"] if errors else [],
    }
    cleaned = report.clean(doc)
    assert isinstance(cleaned, dict)
    return cleaned


def _share(value: float, base: float) -> float:
    return value / base if base > 0 else float("nan")
