"""Command line of the running-usage benchmark (see the package docstring)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import psutil

from bench.command import run_benchmark
from bench.gateway_overhead.processes import BenchError, Launcher, can_pin, pin_self
from bench.gateway_overhead.report import write_results
from bench.results_files import RESULTS_DIR, loadavg, machine, machine_lines
from bench.routing.engines import Engine, start_engines
from serving.models.tiny_model import MODEL_NAME as MODEL
from serving.vllm_flags import VLLM_SERVER_MODULE

STEM = "stream_usage"
PROFILE = "cpu-tiny"
CLIENT_CPU = 1
FINAL = {"include_usage": True}
RUNNING = {"include_usage": True, "continuous_usage_stats": True}
# name: (stream_options, chat_template_kwargs); the profile's default leaves thinking off
VARIANTS: dict[str, tuple[dict[str, bool], dict[str, bool] | None]] = {
    "usage in the last chunk, thinking off": (FINAL, None),
    "usage in every chunk, thinking off": (RUNNING, None),
    "usage in every chunk, thinking on": (RUNNING, {"enable_thinking": True}),
}
BASELINE = "usage in the last chunk, thinking off"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.stream_usage",
        description="vLLM's API server CPU per chat stream: usage in every chunk vs the last.",
    )
    parser.add_argument("--tokens", default="256,1024,1920", help="answer lengths, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=RESULTS_DIR,
        help="results go to DIR/stream_usage/<date>.json and .md (default: bench/results)",
    )
    return parser


def _api_server(launcher: Launcher, engine: Engine) -> psutil.Process:
    """vLLM's API server among the processes `serving engine` started (in a session of
    their own, so not in the launcher's process group)."""
    for process in psutil.Process(launcher.pid(engine.name)).children(recursive=True):
        try:
            if VLLM_SERVER_MODULE in " ".join(process.cmdline()):
                return process
        except psutil.Error:
            continue
    raise BenchError(f"no {VLLM_SERVER_MODULE} process under {engine.name}")


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


async def _stream(
    session: aiohttp.ClientSession, engine: Engine, tokens: int, variant: str
) -> tuple[int, int]:
    """One stream to its end: the chunks read and vLLM's completion token count."""
    options, kwargs = VARIANTS[variant]
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{variant} {tokens} {time.time()}"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": options,
    }
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    chunks, generated = 0, 0
    async with session.post(engine.base_url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise BenchError(f"status {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunks += 1
            usage = json.loads(line[6:]).get("usage")
            if usage:
                generated = int(usage["completion_tokens"])
    return chunks, generated


async def run(args: argparse.Namespace, lengths: list[int]) -> dict[str, object]:
    if can_pin():
        pin_self(CLIENT_CPU)
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        str(length): {name: [] for name in VARIANTS} for length in lengths
    }
    with (
        tempfile.TemporaryDirectory(prefix="stream-usage-") as tmp,
        Launcher(Path(tmp), pin=can_pin()) as launcher,
    ):
        print(f"starting a {PROFILE} engine ...", flush=True)
        (engine,) = await start_engines(launcher, count=1, profile=PROFILE)
        api = _api_server(launcher, engine)
        async with aiohttp.ClientSession() as session:
            for number in range(args.rounds):
                for length in lengths:
                    # each round starts with a different variant: none always runs first
                    names = list(VARIANTS)
                    shift = number % len(names)
                    for name in names[shift:] + names[:shift]:
                        cpu, started = _cpu_s(api), time.perf_counter()
                        chunks, generated = await _stream(session, engine, length, name)
                        sample = {
                            "api_cpu_s": _cpu_s(api) - cpu,
                            "wall_s": time.perf_counter() - started,
                            "chunks": chunks,
                            "completion_tokens": generated,
                        }
                        if generated != length:
                            raise BenchError(f"{name}: {generated} tokens, not {length}")
                        samples[str(length)][name].append(sample)
                        print(f"round {number + 1}, {length} tokens, {name}: {sample}", flush=True)
    return {
        "benchmark": STEM,
        "created": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "command": "python -m bench.stream_usage " + " ".join(sys.argv[1:]),
        "machine": {**machine(), "loadavg_after": loadavg()},
        "plan": {"profile": PROFILE, "rounds": args.rounds, "tokens": lengths},
        "samples": samples,
    }


def _median(values: list[dict[str, float]], field: str) -> float:
    return statistics.median(value[field] for value in values)


def report(doc: dict[str, object]) -> str:
    samples = doc["samples"]
    assert isinstance(samples, dict)
    lines = [
        "# Running usage benchmark", "",
        f"`{doc['command']}` at {doc['created']}; plan: {json.dumps(doc['plan'])}.", "",
        *machine_lines(doc["machine"]),
        "vLLM's API server CPU per chat stream (one stream at a time, medians of the rounds),",
        "and the ratio to usage in the last chunk only at the same length.", "",
        "| answer tokens | stream options | API server CPU per stream | x last-chunk usage "
        "| API server CPU per token | stream wall time |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for length, variants in samples.items():
        base = _median(variants[BASELINE], "api_cpu_s")
        for name, values in variants.items():
            cpu = _median(values, "api_cpu_s")
            lines.append(
                f"| {length} | {name} | {cpu:.2f} s | {cpu / base:.2f}x "
                f"| {cpu / int(length) * 1e6:.0f} µs | {_median(values, 'wall_s'):.2f} s |"
            )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        lengths = [int(value) for value in args.tokens.split(",") if value]
    except ValueError:
        lengths = []
    if args.rounds < 1 or not lengths or min(lengths) < 1:
        print("--rounds and --tokens: positive integers", file=sys.stderr)
        return 2
    return run_benchmark("bench.stream_usage", measure_and_report(args, lengths))


async def measure_and_report(args: argparse.Namespace, lengths: list[int]) -> int:
    doc = await run(args, lengths)
    text = report(doc)
    write_results(doc, args.output_dir, STEM, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
