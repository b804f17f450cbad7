"""The pods the manifests describe, run as real processes on this machine.

There is no Kubernetes API server here, so the rendered cpu-demo overlay is read the way the
kubelet reads it and its containers' commands run locally against the shared real engine:

- the gateway container exactly as rendered (command, ConfigMap settings, env, Secret mounts),
  with a key file written by `serving keys create --emit-yaml` where the Secret is mounted,
  the engine Service's name resolved to the shared engine and the Redis Service's to the
  Redis pod's container as rendered (its args, its password from the stand-in Secret, its
  readiness probe passing): the gateway's probes answer,
  the official client is served with that key's limits (counted in Redis), and SIGTERM
  drains within the grace period;
- the engine's preStop hook: it waits while vLLM still has a stream running and returns once
  the stream is done (and at once when vLLM is idle);
- every vLLM metric the manifests query (KEDA triggers, the preStop hook) exists on the real
  engine's /metrics, so autoscaling and draining do not read series that vLLM does not export.

Mount paths become temporary directories and the Service's DNS name becomes loopback; each
substitution is checked first (the name and port are the engine Service's), so the test
speaks for the manifest and not for a copy of it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from openai import OpenAI

from tests.integration.conftest import REPO, Stack, eventually, serving_env
from tests.integration.oracle import front
from tests.k8s.rendered import Obj, Rendered, Renders, gateway_env
from tests.ports import free_port

pytestmark = pytest.mark.timeout(600)

RENDERS = Renders()


@pytest.fixture(scope="module")
def demo() -> Rendered:
    return RENDERS("cpu-demo")


def probe_path(container: Obj, probe: str) -> str:
    path: str = container[probe]["httpGet"]["path"]
    return path


def service_port(rendered: Rendered, name: str, port_name: str | None = None) -> int:
    """The Service's port named `port_name` (None: its only port, or the `http` one)."""
    ports = rendered.one("Service", name)["spec"]["ports"]
    if port_name is None and len(ports) > 1:
        port_name = "http"
    [port] = [port for port in ports if port_name in (None, port["name"])]
    return int(port["port"])


def mounted_files(rendered: Rendered, container: Obj, root: Path) -> dict[str, Path]:
    """mountPath -> a local directory standing in for it (Secrets: the user creates them)."""
    spec = rendered.one("Deployment", "gateway")["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in spec.get("volumes") or []}
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        local = root / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        mounts[mount["mountPath"]] = local
        assert mount["name"] in volumes, f"mount {mount['name']} has no volume"
    return mounts


def local_path(path: str, mounts: dict[str, Path]) -> Path:
    """Where `path` (inside the container) lies here; it must be on a mounted volume."""
    for mount_path, local in mounts.items():
        inside = Path(path).relative_to(mount_path) if path.startswith(mount_path) else None
        if inside is not None:
            return local / inside
    raise AssertionError(f"{path} is on no volume mounted in the container")


def create_key(rpm: int) -> tuple[str, str]:
    """`serving keys create --emit-yaml` as k8s/README.md runs it: (keys.yaml text, secret)."""
    done = subprocess.run(
        [sys.executable, "-m", "serving.cli", "keys", "create", "--name", "k8s-demo",
         "--rpm", str(rpm), "--emit-yaml"],
        env=serving_env(), cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    match = re.search(r"secret: (\S+)", done.stderr)
    assert match, done.stderr
    return done.stdout, match.group(1)


@pytest.fixture
def redis_service(demo: Rendered, tmp_path: Path) -> Iterator[str]:
    """The Redis pod as rendered, behind the URL the gateway's Secret names: its container's
    command and args (`$(VAR)` expanded from its env, the Secret's password a stand-in, the
    data volume a temporary directory) on a port of the test's own, ready by its own
    readiness probe. Yields the URL resolved to it (the quota store fails closed: no Redis,
    no readiness)."""
    url = urlsplit(gateway_env(demo)["SERVING_GATEWAY_REDIS_URL"])
    assert url.hostname == "redis" and url.port == service_port(demo, "redis")
    assert url.password, "the stand-in Secret URL carries the password"
    container = demo.container("StatefulSet", "redis", "redis")
    assert int(container["ports"][0]["containerPort"]) == url.port
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        ref = item["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == ("redis", "password"), item
        env[item["name"]] = url.password
    [data] = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "data"]
    directory = tmp_path / "redis-data"
    directory.mkdir()
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in container["args"]]
    assert data in args, "the data volume is redis-server's --dir"
    args = [str(directory) if arg == data else arg for arg in args]
    program = shutil.which(container["command"][0])
    assert program, f"{container['command'][0]} is not installed (make system-deps)"
    port = free_port()
    # Later options win in redis-server: the pod's port 6379 becomes a free one here.
    command = [
        program,
        *container["command"][1:],
        *args,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
    ]
    probe = list(container["readinessProbe"]["exec"]["command"])
    assert probe[-1].count("redis-cli ") == 1, probe
    probe[-1] = probe[-1].replace("redis-cli ", f"redis-cli -p {port} ")
    log = tmp_path / "redis.log"
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:

        def ready() -> bool:
            assert process.poll() is None, log.read_text()
            return subprocess.run(probe, env={**os.environ, **env}, timeout=30).returncode == 0

        eventually(ready, budget_s=30)
        yield f"redis://:{url.password}@127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_gateway_pod_as_rendered_serves_with_its_secret_and_drains(
    demo: Rendered, stack: Stack, redis_service: str, tmp_path: Path
) -> None:
    container = demo.container("Deployment", "gateway", "gateway")
    env = gateway_env(demo)
    # The headless engine Service's name and port (discovery), here the shared engine on
    # loopback (tests/integration/test_engine_discovery.py runs discovery with a DNS server).
    assert env["SERVING_GATEWAY_UPSTREAM"].startswith("dns+")
    upstream = urlsplit(env["SERVING_GATEWAY_UPSTREAM"].removeprefix("dns+"))
    assert upstream.hostname == "engine-headless"
    assert upstream.port == service_port(demo, "engine-headless")
    env["SERVING_GATEWAY_UPSTREAM"] = stack.engine_url
    # The Redis Service, resolved to a redis-server of the test's own (`redis_service`).
    env["SERVING_GATEWAY_REDIS_URL"] = redis_service
    # Listen where the container port says, on loopback here (0.0.0.0 in the pod).
    port_spec = next(p for p in container["ports"] if p["name"] == "http")
    assert int(env["SERVING_GATEWAY_PORT"]) == port_spec["containerPort"]
    assert service_port(demo, "gateway") == port_spec["containerPort"]
    port = free_port()
    env.update(SERVING_GATEWAY_HOST="127.0.0.1", SERVING_GATEWAY_PORT=str(port))
    # Every series on the port the ServiceMonitor scrapes (a free one here); the API port's
    # /metrics has the aggregate ones only.
    metrics_spec = next(p for p in container["ports"] if p["name"] == "metrics")
    assert int(env["SERVING_GATEWAY_METRICS_PORT"]) == metrics_spec["containerPort"]
    assert service_port(demo, "gateway", "metrics") == metrics_spec["containerPort"]
    metrics_port = free_port()
    env["SERVING_GATEWAY_METRICS_PORT"] = str(metrics_port)
    mounts = mounted_files(demo, container, tmp_path)
    keys_yaml, secret = create_key(rpm=1000)
    keys_file = local_path(env["SERVING_GATEWAY_KEYS_FILE"], mounts)
    keys_file.write_text(keys_yaml)
    env["SERVING_GATEWAY_KEYS_FILE"] = str(keys_file)
    if "SERVING_HOME" in env:  # the pod's writable state directory (an emptyDir)
        env["SERVING_HOME"] = str(local_path(env["SERVING_HOME"], mounts))
    program = shutil.which(container["command"][0], path=str(Path(sys.executable).parent))
    assert program, f"{container['command'][0]} is not installed in this venv"
    base_env = {k: v for k, v in serving_env().items() if not k.startswith("SERVING_")}
    log = tmp_path / "gateway.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [program, *container["command"][1:], *(container.get("args") or [])],
            env={**base_env, **env}, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def answers(path: str) -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return requests.get(f"{url}{path}", timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            path = probe_path(container, probe)
            eventually(lambda path=path: answers(path), budget_s=60)  # type: ignore[misc]
        client = OpenAI(base_url=f"{url}/v1", api_key=secret)
        with front(url, stack.engine_url):
            reply = client.chat.completions.with_raw_response.create(
                model="qwen3-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert reply.http_response.status_code == 200
        assert reply.headers["x-ratelimit-limit-requests"] == "1000"
        public = requests.get(f"{url}/metrics", timeout=5)
        assert public.status_code == 200 and 'key="' not in public.text
        scraped = requests.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
        assert scraped.status_code == 200 and "gateway_requests_total{key=" in scraped.text
        # What the kubelet does at termination: SIGTERM, then the grace period at most.
        grace = demo.one("Deployment", "gateway")["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ]
        process.send_signal(signal.SIGTERM)
        eventually(lambda: not answers(probe_path(container, "readinessProbe")), budget_s=10)
        # uvicorn re-raises SIGTERM once it has shut down, so the status says "terminated by
        # SIGTERM" (the kubelet's 143) after a clean shutdown.
        assert process.wait(timeout=grace) in (0, -signal.SIGTERM), log.read_text()
        assert "Application shutdown complete." in log.read_text()
        assert secret not in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


ENDPOINT_DELAY = "time.sleep(15)"


def prestop_command(rendered: Rendered, metrics_url: str) -> list[str]:
    container = rendered.container("Deployment", "engine", "vllm")
    command: list[str] = list(container["lifecycle"]["preStop"]["exec"]["command"])
    assert command[0] == "python3"
    script = command[-1]
    assert script.count("http://127.0.0.1:8000/metrics") == 1, script
    assert int(container["ports"][0]["containerPort"]) == 8000
    script = script.replace("http://127.0.0.1:8000/metrics", metrics_url)
    # The hook first gives the endpoint removal 15 s to spread; no endpoints here, so it polls
    # at once and the test's stream (seconds long) spans several of its polls.
    assert script.count(ENDPOINT_DELAY) == 1, script
    return [sys.executable, *command[1:-1], script.replace(ENDPOINT_DELAY, "time.sleep(0)")]


def test_the_engine_prestop_returns_at_once_when_idle(demo: Rendered, stack: Stack) -> None:
    command = prestop_command(demo, f"{stack.engine_url}/metrics")
    grace = demo.one("Deployment", "engine")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=grace)
    assert done.returncode == 0, done.stderr


# Near the cpu-demo profile's 2,048-token context: tens of seconds of decoding on 2 cores.
STREAM_TOKENS = 1800


def test_the_engine_prestop_waits_for_a_running_stream(demo: Rendered, stack: Stack) -> None:
    with stack.off_the_books():  # the stream goes to vLLM itself, as the kubelet sees it
        prestop_waits_for_a_stream(demo, stack)


def prestop_waits_for_a_stream(demo: Rendered, stack: Stack) -> None:
    command = prestop_command(demo, f"{stack.engine_url}/metrics")
    client = stack.direct_client()
    stream = client.chat.completions.create(
        model="qwen3-tiny",
        messages=[{"role": "user", "content": "Tell me a long story."}],
        max_tokens=STREAM_TOKENS,
        stream=True,
        extra_body={"ignore_eos": True, "min_tokens": STREAM_TOKENS},
    )
    first = next(iter(stream))  # vLLM is running the request now
    assert first is not None
    started = time.monotonic()
    hook = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finished: dict[str, float] = {}

    def drain_stream() -> None:
        for _ in stream:
            pass
        finished["at"] = time.monotonic()

    reader = threading.Thread(target=drain_stream)
    reader.start()
    try:
        hook.wait(timeout=300)
        returned = time.monotonic()
        reader.join(timeout=300)
        assert hook.returncode == 0, hook.stdout.read() if hook.stdout else ""
        # The hook returned only once the stream had ended (vLLM's metrics lag the end by
        # at most their update; the stream's last byte is read before or at that moment).
        assert "at" in finished and returned >= finished["at"] - 1.0
        # ...and the stream outlived the hook's first polls (every 2 s), so it really waited.
        assert finished["at"] - started > 3, "the stream ended too soon to show the wait"
    finally:
        if hook.poll() is None:
            hook.kill()
        reader.join(timeout=60)


def queried_vllm_metrics(rendered: Rendered) -> set[str]:
    text = yaml.safe_dump_all(list(rendered.objects))
    return set(re.findall(r"vllm:[A-Za-z0-9_]+", text))


def test_every_vllm_metric_the_manifests_query_is_exported(
    renders_all: dict[str, Rendered], stack: Stack
) -> None:
    queried: set[str] = set()
    for rendered in renders_all.values():
        queried |= queried_vllm_metrics(rendered)
    assert "vllm:num_requests_waiting" in queried  # the engine's autoscaling signal
    exported = requests.get(f"{stack.engine_url}/metrics", timeout=30).text
    names = {line.split("{")[0].split(" ")[0] for line in exported.splitlines() if line[:1] != "#"}
    names |= {name.removesuffix(suffix) for name in names for suffix in ("_total", "_sum",
              "_count", "_bucket") if name.endswith(suffix)}  # fmt: skip
    missing = sorted(queried - names)
    assert not missing, f"the manifests query vLLM metrics the engine does not export: {missing}"


@pytest.fixture(scope="module")
def renders_all() -> dict[str, Rendered]:
    from tests.k8s.rendered import overlay_names

    return {name: RENDERS(name) for name in overlay_names()}
