"""Which HTTP client should the Locust LLM user use? CPU per streamed request, side by side.

Each client runs in its own process, gevent-patched as under Locust, and streams N chat
completions (64 tokens, one SSE chunk each) from the fake upstream running in another
process with no delays, so the process time measured is the client's own work per request:
what limits how much load one Locust process can generate.

Usage: `.venv/bin/python bench/loadtest_client.py [--requests 300]`; writes
bench/results/loadtest-client/<date>.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from serving.models.tiny_model import MODEL_NAME

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ("geventhttpclient", "requests", "openai")
TOKENS = 64


def body() -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hello " * 20}],
        "max_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def run_client(name: str, url: str, count: int) -> float:
    """Seconds of process CPU per request."""
    from gevent import monkey

    monkey.patch_all()
    import json as _json

    if name == "geventhttpclient":
        from geventhttpclient import HTTPClient

        client = HTTPClient.from_url(url, concurrency=1, network_timeout=60)

        def one() -> int:
            response = client.post(
                "/v1/chat/completions",
                body=_json.dumps(body()),
                headers={"Content-Type": "application/json"},
            )
            lines = 0
            while response.readline(b"\n"):
                lines += 1
            return lines
    elif name == "requests":
        import requests

        session = requests.Session()

        def one() -> int:
            with session.post(f"{url}/v1/chat/completions", json=body(), stream=True) as response:
                return sum(1 for _ in response.iter_lines())
    else:
        from openai import OpenAI

        sdk = OpenAI(base_url=f"{url}/v1", api_key="unused")

        def one() -> int:
            stream = sdk.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": "hello " * 20}],
                max_tokens=TOKENS,
                stream=True,
                stream_options={"include_usage": True},
            )
            return sum(1 for _ in stream)

    for _ in range(10):  # warm up: imports, connection
        one()
    started = time.process_time()
    for _ in range(count):
        one()
    return (time.process_time() - started) / count


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--client", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        print(json.dumps({"cpu_s_per_request": run_client(args.client, args.url, args.requests)}))
        return
    port = free_port()
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.loadtest.fake_upstream", "--port", str(port),
         "--ttft", "0", "--itl", "0"],
        cwd=ROOT,
    )  # fmt: skip
    try:
        time.sleep(2)
        results: dict[str, float] = {}
        for name in CLIENTS:
            out = subprocess.run(
                [sys.executable, __file__, "--client", name, "--url", f"http://127.0.0.1:{port}",
                 "--requests", str(args.requests)],
                capture_output=True, text=True, check=True, cwd=ROOT,
            )  # fmt: skip
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])["cpu_s_per_request"]
    finally:
        fake.terminate()
        fake.wait()
    base = results["geventhttpclient"]
    print(f"{'client':<18}{'CPU ms/request':>16}{'vs geventhttpclient':>22}")
    for name, seconds in results.items():
        print(f"{name:<18}{seconds * 1000:>16.2f}{seconds / base:>21.1f}x")
    sys.path.insert(0, str(ROOT))  # run as a file, the checkout is not on the path
    from bench.results_files import RESULTS_DIR, loadavg, machine, run_stem

    created = datetime.now(UTC).replace(microsecond=0).isoformat()
    record = {
        "created": created,
        "machine": {**machine(), "loadavg_after": loadavg()},
        "tokens_per_request": TOKENS,
        "requests": args.requests,
        "cpu_s_per_request": results,
    }
    out_dir = RESULTS_DIR / "loadtest-client"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{run_stem(out_dir, created)}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
