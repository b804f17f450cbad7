"""Every command the docs show is accounted for: run by a test, or listed here as not run.

A command is a line of a ```bash block on a page of the site (README.md, k8s/README.md,
monitoring/RUNBOOK.md and docs/*.md), with its backslash continuations joined and its trailing
comment dropped; a heredoc (`python - <<'PY'` ... `PY`) is one command, named by its first
line. COMMANDS says, for each page's commands, which of three things holds:

    Parsed(test)          the test reads the command out of the page and runs it as printed
                          (the test file names the page)
    Runs(test, needle)    the test runs the same command, written in the test (the test file
                          holds `needle`, the part that makes it that command)
    NotRun(why)           not run by any test, and why (a GPU, a cluster, a registry the
                          machine cannot reach, a foreground server, or CI runs it)

A command added to a page without an entry here fails, and so does an entry whose command
left its page: the list cannot fall behind the docs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mkdocs_hooks import OUTSIDE

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Parsed:
    test: str


@dataclass(frozen=True)
class Runs:
    test: str
    needle: str


@dataclass(frozen=True)
class NotRun:
    why: str


Verdict = Parsed | Runs | NotRun

GPU = NotRun("needs GPUs (a shipped GPU profile); its flags are checked by vLLM's parser")
CLUSTER = NotRun("needs a Kubernetes cluster; the manifests are validated offline (make k8s-check)")
REGISTRY = NotRun("needs a container registry or a Helm repository this machine cannot reach")
SERVER = NotRun("a server in the foreground until Ctrl-C; the same code runs in tests")
# Make's part is run (`make -n`, parsed by `serving up`'s parser); the stack it starts is
# `serving up` with several profiles, which the pooling_stack fixture runs.
MAKE_UP_POOLING = Runs("tests/test_stack.py", "POOLING=cpu-tiny-embedding cpu-tiny-reranker")
HEREDOC = NotRun(
    "a reader's script against `make up`; the same calls run in tests/integration (see the page)"
)

COMMANDS: dict[str, dict[str, Verdict]] = {
    "README.md": {
        "make up": Runs("tests/integration/test_readme_quickstart.py", '"make", "up"'),
        "make test": NotRun("CI runs it (.ci/run)"),
        ".venv/bin/serving profiles list": Runs("tests/profiles/test_command.py", '"list"'),
        ".venv/bin/serving profiles show cpu-tiny-tp2": Runs(
            "tests/profiles/test_command.py", '"show"'
        ),
        ".venv/bin/serving profiles render qwen2.5-7b-fp16-tp4-4090": Runs(
            "tests/profiles/test_command.py", '"render"'
        ),
        ".venv/bin/serving keys create --name team-a --rpm 60 --tpm 20000 --max-concurrency 4 "
        "--max-tokens 1024": Parsed("tests/integration/test_readme_quickstart.py"),
        ".venv/bin/python - <<'PY'": NotRun(
            "a reader's script with a secret to paste; tests/integration/"
            "test_readme_quickstart.py makes the same call with the key it created"
        ),
    },
    "docs/adapters.md": {
        ".venv/bin/serving engine --profile cpu-tiny-lora --dry-run": Runs(
            "tests/engine/test_adapters.py", '"engine", "--profile", "cpu-tiny-lora", "--dry-run"'
        ),
        ".venv/bin/serving engine --profile cpu-tiny-lora --port 8001": SERVER,
        "curl -s http://127.0.0.1:8001/v1/models": Runs(
            "tests/integration/tenants/test_lora.py", "/v1/models"
        ),
        "curl -s http://127.0.0.1:8001/v1/chat/completions -H 'Content-Type: application/json' "
        '-d \'{"model": "team-a", "messages": [{"role": "user", "content": '
        '"What is your name?"}]}\'': (
            Runs("tests/integration/tenants/test_lora.py", "greedy(client, ADAPTER, chat)")
        ),
        ".venv/bin/serving plan --profile cpu-tiny-lora": Parsed("tests/planner/test_lora.py"),
        ".venv/bin/serving plan --model Qwen3-8B --gpu rtx-4090 --max-model-len 8192 --max-loras 8 "
        "--max-lora-rank 256": Parsed("tests/planner/test_lora.py"),
        ".venv/bin/serving model tiny-lora": Runs(
            "tests/models/test_tiny_lora.py", '"model", "tiny-lora"'
        ),
        ".venv/bin/serving keys create --name team-a --models team-a --default-adapter team-a "
        "--model-limit team-a:tpm=20000": Runs(
            "tests/integration/tenants/test_tenants.py", '"--default-adapter", ADAPTER'
        ),
        "export SERVING_ADMIN_KEY='<admin key>'": NotRun(
            "a placeholder for a secret; the tests set SERVING_ADMIN_KEY to a key of their own"
        ),
        ".venv/bin/serving adapters load team-b /adapters/team-b": Runs(
            "tests/gateway/adapters/test_adapters_command.py", '"load", "team-a", "/adapters/a"'
        ),
        ".venv/bin/serving adapters list": Runs(
            "tests/gateway/adapters/test_adapters_command.py", '*where, "list"'
        ),
        ".venv/bin/serving adapters unload team-b": Runs(
            "tests/gateway/adapters/test_adapters_command.py", '*where, "unload", "team-a"'
        ),
    },
    "docs/batches.md": {
        ".venv/bin/serving batches list --status in_progress": Runs(
            "tests/gateway/test_batches_command.py", '"--status", "in_progress"'
        ),
    },
    "docs/contributing-docs.md": {
        "make docs": Runs("tests/test_docs_site.py", '"mkdocs", "build", "--strict"'),
        ".venv/bin/mkdocs serve": SERVER,
    },
    "docs/gateway.md": {
        ".venv/bin/serving keys create --name team-b --rpm 60 --tpm 20000 --tokens-per-day "
        "1000000 --tokens-per-month 20000000 --max-concurrency 4 --max-tokens 1024 --models "
        "qwen3-tiny": Runs("tests/gateway/test_keys_command.py", '"--tokens-per-month"'),
        ".venv/bin/serving keys list": Runs("tests/gateway/test_keys_command.py", '"list"'),
        ".venv/bin/serving keys show key_5e01c9a7": Runs(
            "tests/gateway/test_keys_command.py", '"show", key_id'
        ),
        ".venv/bin/serving keys revoke key_5e01c9a7": Runs(
            "tests/gateway/test_keys_command.py", '"revoke", key_id'
        ),
    },
    "docs/images.md": {
        "make up PROFILE=cpu-tiny-vl": Runs(
            "tests/integration/vision/conftest.py", 'PROFILE = "cpu-tiny-vl"'
        ),
        ".venv/bin/python - <<'PY'": HEREDOC,
    },
    "docs/kubernetes.md": {
        ".venv/bin/serving k8s render --profile qwen2.5-7b-fp16-tp4-4090": Parsed(
            "tests/k8s/test_readme_commands.py"
        ),
        ".venv/bin/serving k8s render --all": Parsed("tests/k8s/test_readme_commands.py"),
        ".venv/bin/serving k8s render --all --check": Parsed("tests/k8s/test_readme_commands.py"),
        "make k8s-check": Runs("Makefile", "k8s-check: $(STAMP) $(K8S_STAMP)"),
    },
    "docs/load-testing.md": {
        "make loadtest": Runs("tests/integration/test_loadtest.py", '"run", "--'),
        'make loadtest LOADTEST_ARGS="--workload mixed --users 8 --duration 60s"': Runs(
            "tests/loadtest/test_workload.py", "mixed"
        ),
        '.venv/bin/python -m loadtest run --host http://127.0.0.1:8000 --api-key "$KEY" '
        "--engine-metrics http://127.0.0.1:8001/metrics --gateway-metrics "
        "http://127.0.0.1:8100/metrics --workload long-context --step-ramp 1,2,10s,4 "
        "--processes 2 --out var/loadtest/ramp": Runs(
            "tests/loadtest/test_run.py", '"--step-ramp", "1,2,2s,2", "--processes", "2"'
        ),
        ".venv/bin/python -m loadtest sweep ... --levels 1,2,4,8 --duration 30s": Runs(
            "tests/loadtest/test_commands.py", '"sweep"'
        ),
        ".venv/bin/serving engine --profile cpu-tiny-smallkv --port 8001 &": Runs(
            "tests/integration/test_memory_plan.py", 'PROFILE = "cpu-tiny-smallkv"'
        ),
        ".venv/bin/python -m loadtest memory --profile cpu-tiny-smallkv --host "
        "http://127.0.0.1:8001 --engine-metrics http://127.0.0.1:8001/metrics --out "
        "var/loadtest/memory": Runs("tests/integration/test_memory_plan.py", '"memory", "--'),
    },
    "docs/monitoring.md": {
        "make up": Runs("tests/integration/test_readme_quickstart.py", '"make", "up"'),
        "make monitor": Runs("tests/monitoring/test_local.py", "monitoring.prometheus.local"),
    },
    "docs/multi-node.md": {
        "openssl rand -hex 32 > ray-token": NotRun("a token file for two machines"),
        ".venv/bin/serving plan --model Qwen2.5-72B-Instruct --gpu rtx-4090 --gpus 4 "
        "--gpus-per-node 4 --tp 4 --max-model-len 32768": Parsed(
            "tests/planner/test_multi_node_doc.py"
        ),
        ".venv/bin/serving plan --profile qwen2.5-72b-pp2-tp4-2x4090x4": Parsed(
            "tests/planner/test_multi_node_doc.py"
        ),
        'RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$(cat ray-token)" .venv/bin/serving engine '
        "--profile qwen2.5-72b-pp2-tp4-2x4090x4 --ray-head --ray-node-ip 10.0.0.1 --host "
        "10.0.0.1": GPU,
        'RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$(cat ray-token)" .venv/bin/ray start --address '
        "10.0.0.1:6379 --block": NotRun(
            "a second machine; tests/integration/test_multi_node.py runs two Ray nodes on one"
        ),
        ".venv/bin/serving gateway --upstream http://10.0.0.1:8001": NotRun(
            "a second machine's address; the gateway runs against local engines in every "
            "integration test"
        ),
    },
    "docs/planner.md": {
        ".venv/bin/serving plan --profile qwen2.5-7b-fp16-tp4-4090": Runs(
            "tests/planner/test_profile_plan.py", "qwen2.5-7b-fp16-tp4-4090"
        ),
        ".venv/bin/serving plan --model Qwen2.5-7B-Instruct --gpu rtx-4090 --gpus 1 "
        "--max-model-len 32768 --gpu-memory-utilization 0.7 --json": Runs(
            "tests/planner/test_command.py", '"--model", "Qwen2.5-7B-Instruct"'
        ),
        ".venv/bin/serving plan --profile qwen3-coder-30b-a3b-h100": Runs(
            "tests/planner/test_profile_plan.py", "qwen3-coder-30b-a3b-h100"
        ),
        ".venv/bin/serving plan --model Qwen/Qwen3-Reranker-8B --gpu l40s --max-model-len 8192 "
        "--runner pooling": Runs("tests/planner/test_command.py", '"Qwen/Qwen3-Reranker-8B"'),
    },
    "docs/anthropic.md": {
        ".venv/bin/serving plan --profile qwen3-coder-30b-a3b-h100": Runs(
            "tests/planner/test_profile_plan.py", "qwen3-coder-30b-a3b-h100"
        ),
        ".venv/bin/serving up --profile qwen3-coder-30b-a3b-h100": GPU,
    },
    "docs/retrieval.md": {
        'make up POOLING="cpu-tiny-embedding cpu-tiny-reranker"': MAKE_UP_POOLING,
    },
    "docs/profiles.md": {
        "python -m venv .venv && .venv/bin/pip install -e '.[gpu,dev]'": NotRun(
            "installs vLLM's CUDA build, for a GPU machine"
        ),
        ".venv/bin/serving profiles show tests/fixtures/broken-profile.yaml": Runs(
            "tests/profiles/test_command.py", '"tests/fixtures/broken-profile.yaml"'
        ),
        ".venv/bin/serving plan --profile qwen2.5-7b-fp16-tp4-4090": Runs(
            "tests/planner/test_profile_plan.py", "qwen2.5-7b-fp16-tp4-4090"
        ),
        ".venv/bin/serving up --profile qwen2.5-7b-fp16-tp4-4090": GPU,
        ".venv/bin/serving engine --profile cpu-tiny --port 8001": Runs(
            "tests/integration/conftest.py", '"serving.cli", "engine", "--profile"'
        ),
        ".venv/bin/serving engine --profile cpu-tiny --dry-run": Runs(
            "tests/engine/test_engine_command.py", '"--dry-run"'
        ),
        ".venv/bin/serving model awq": Runs("tests/engine/test_model_command.py", '"awq"'),
        ".venv/bin/serving model awq --model ./Qwen2.5-7B-Instruct --out ./qwen2.5-7b-awq "
        "[--group-size 128] [--calibration my-domain.txt ...] [--samples 32] "
        "[--seq-len 256]": NotRun("needs a real Qwen checkpoint, which nothing downloads here"),
        ".venv/bin/serving up --profile cpu-tiny-awq": Runs(
            "tests/integration/test_awq.py", '"cpu-tiny-awq"'
        ),
        ".venv/bin/serving plan --profile qwen3-embedding-8b-l40s": Runs(
            "tests/planner/test_command.py", '"qwen3-embedding-8b-l40s"'
        ),
        'make up POOLING="cpu-tiny-embedding cpu-tiny-reranker"': MAKE_UP_POOLING,
        ".venv/bin/serving up --profile cpu-tiny --profile cpu-tiny-embedding --profile "
        "cpu-tiny-reranker": SERVER,
        ".venv/bin/serving model tiny-embedding": Runs(
            "tests/engine/test_model_command.py", '"tiny-embedding"'
        ),
        ".venv/bin/serving model tiny-reranker": Runs(
            "tests/engine/test_model_command.py", '"tiny-reranker"'
        ),
    },
    "docs/scale-out.md": {
        ".venv/bin/serving gateway --upstream dns+http://engine-headless:8000": CLUSTER,
        ".venv/bin/serving gateway --upstream dns+http://engines.example:8000 --dns-nameserver "
        "10.96.0.10:53": Runs("tests/integration/test_engine_discovery.py", '"--dns-nameserver"'),
        "export REDIS_URL=redis://:PASSWORD@redis:6379/0": Parsed(
            "tests/gateway/keys/test_keys_command_redis.py"
        ),
        '.venv/bin/serving keys create --name team-a --rpm 60 --redis-url "$REDIS_URL"': Parsed(
            "tests/gateway/keys/test_keys_command_redis.py"
        ),
        '.venv/bin/serving keys list --redis-url "$REDIS_URL"': Parsed(
            "tests/gateway/keys/test_keys_command_redis.py"
        ),
    },
    "docs/testing.md": {
        "make check": NotRun("runs this suite's fast tier; make test runs all of it"),
        "make test": NotRun("CI runs it (.ci/run)"),
        ".venv/bin/python -m pytest -q -m redis": NotRun("a part of the suite make test runs"),
        '.venv/bin/python -m pytest -q -m "not engine"': NotRun(
            "a part of the suite make test runs"
        ),
        ".venv/bin/python -m pytest -q --check-tier tests/gateway": NotRun(
            "a part of the suite make check runs"
        ),
        ".venv/bin/python -m pytest -q --service-tier": NotRun(
            "the part of the suite make test adds"
        ),
    },
    "docs/tools.md": {".venv/bin/python - <<'PY'": HEREDOC},
    "docs/usage-reports.md": {
        ".venv/bin/serving usage report --from 2026-03-01 --to 2026-03-31": Parsed(
            "tests/gateway/test_usage_command.py"
        ),
        ".venv/bin/serving usage report --from 2026-03-01 --to 2026-03-31 --key key_5e01c9a7 "
        "--format csv": Parsed("tests/gateway/test_usage_command.py"),
        ".venv/bin/serving usage report --from 2026-03-01 --to 2026-03-31 --format json "
        '--redis-url "$REDIS_URL"': Parsed("tests/gateway/test_usage_command.py"),
        'curl -s -H "Authorization: Bearer $SERVING_ADMIN_KEY" "http://127.0.0.1:8000/admin/v1/'
        'usage?from=2026-03-01&to=2026-03-31&key=key_9b3f0d21"': Runs(
            "tests/gateway/test_usage_reports.py", 'http.get(f"{USAGE_PATH}?{query}")'
        ),
    },
    "k8s/README.md": {},  # filled below: most of its steps need a cluster
}

# k8s/README.md: only its key and render lines run here (tests/k8s/test_readme_commands.py).
K8S_RUN_HERE: dict[str, Verdict] = {
    ".venv/bin/serving keys create --name team-a --rpm 60 --tpm 20000 --max-concurrency 4 "
    "--emit-yaml > keys.yaml": Parsed("tests/k8s/test_readme_commands.py"),
    "kubectl -n qwen-serving create secret generic gateway-keys --from-file=keys.yaml": Parsed(
        "tests/k8s/test_readme_commands.py"
    ),
    ".venv/bin/serving k8s render --all": Runs("tests/k8s/test_command.py", '"--all"'),
    ".venv/bin/serving k8s render --all --check": Runs("tests/k8s/test_command.py", '"--check"'),
    ".venv/bin/serving k8s render --profile qwen2.5-7b-awq-4090": Runs(
        "tests/k8s/test_command.py", '"--profile"'
    ),
    ".venv/bin/serving keys create --name team-b --rpm 60 --tpm 20000 --emit-yaml >> keys.yaml": (
        Runs("tests/gateway/test_keys_command.py", '"--emit-yaml"')
    ),
}


def verdict(page: str, command: str) -> Verdict | None:
    if page == "docs/capacity.md" and command.startswith("serving plan "):
        return Parsed("tests/planner/test_capacity_doc.py")  # every quoted run, output too
    if page == "k8s/README.md":
        if command in K8S_RUN_HERE:
            return K8S_RUN_HERE[command]
        if command.startswith(("helm ", "docker ")):
            return REGISTRY
        if command.startswith(("kubectl ", "kind ", "curl ", "sed ", "REDIS_PASSWORD=")):
            return CLUSTER
        return None
    return COMMANDS.get(page, {}).get(command)


def pages() -> list[str]:
    return [*OUTSIDE, *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")))]


BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
HEREDOC_START = re.compile(r"<<-?'?(\w+)'?\s*$")
PROMPT = "$ "


def commands(markdown: str) -> list[str]:
    """The commands a page shows, as a reader would type each: every line of a bash block,
    and in a block of a command with its output, each line after a `$ ` prompt."""
    found: list[str] = []
    for language, block in BLOCK.findall(markdown):
        if language not in ("bash", "", "text", "console"):
            continue
        lines = iter(block.replace("\\\n", " ").splitlines())
        for line in lines:
            text = line.strip()
            if language != "bash":
                if not text.startswith(PROMPT):
                    continue
                text = text.removeprefix(PROMPT)
            if not text or text.startswith("#"):
                continue
            heredoc = HEREDOC_START.search(text)
            if heredoc:  # the body is the command's input, not commands
                for rest in lines:
                    if rest.strip() == heredoc.group(1):
                        break
            else:
                text = re.sub(r"\s+#\s.*$", "", text)
            found.append(" ".join(text.split()))
    return found


def test_every_command_on_a_page_is_run_or_listed() -> None:
    missing = [
        f"{page}: {command}"
        for page in pages()
        for command in commands((ROOT / page).read_text(encoding="utf-8"))
        if verdict(page, command) is None
    ]
    assert not missing, "add each to tests/test_docs_commands.py:\n" + "\n".join(missing)


def test_every_listed_command_is_still_on_its_page() -> None:
    shown = {page: set(commands((ROOT / page).read_text(encoding="utf-8"))) for page in pages()}
    listed = [(p, c) for p, entries in COMMANDS.items() for c in entries]
    listed += [("k8s/README.md", c) for c in K8S_RUN_HERE]
    stale = [f"{page}: {command}" for page, command in listed if command not in shown[page]]
    assert not stale, "no longer on the page:\n" + "\n".join(stale)


def test_each_named_test_still_runs_its_command() -> None:
    entries = [(p, c, v) for p, e in COMMANDS.items() for c, v in e.items()]
    entries += [("k8s/README.md", c, v) for c, v in K8S_RUN_HERE.items()]
    wrong: list[str] = []
    for page, command, found in entries:
        if isinstance(found, NotRun):
            continue
        source = (ROOT / found.test).read_text(encoding="utf-8")
        needle = (
            found.needle if isinstance(found, Runs) else page.removeprefix("docs/").split("/")[-1]
        )
        if needle not in source:
            wrong.append(f"{page}: {command} -> {found.test} lacks {needle!r}")
    assert not wrong, "\n".join(wrong)


def test_the_command_reader_joins_continuations_and_skips_heredoc_bodies() -> None:
    page = (
        "```bash\nmake up   # start\n# a comment\nserving plan \\\n  --json\n"
        "python - <<'PY'\nimport os\nPY\nmake test\n```\n"
        "```\n$ serving keys list\nkey_1 (a)\n$ python - <<'PY'\nprint(1)\nPY\n```\n"
        "```yaml\n$ not: a command\n```\n"
    )
    assert commands(page) == [
        "make up", "serving plan --json", "python - <<'PY'", "make test", "serving keys list",
        "python - <<'PY'",
    ]  # fmt: skip
