"""Every shipped profile renders to flags that vLLM's own parser and EngineArgs accept, every
flag this module knows is one of vLLM's, and no other module spells one."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import vllm.entrypoints.launchers.cli_args as vllm_cli

from serving import vllm_flags as flags
from serving.profiles import Profile, load_all_profiles, load_profile
from serving.profiles.lora import Lora, LoraAdapter
from serving.vllm_flags import (
    BENCH_FLAGS,
    ENGINE_FLAGS,
    LORA_RANKS,
    VLLM_SERVER_MODULE,
    BenchServe,
    bench_serve_args,
    engine_args,
    engine_flag,
    negated,
    render,
)

REPO = Path(__file__).resolve().parents[1]  # this file is tests/test_vllm_flags.py
SOURCE_DIRS = ("serving", "loadtest", "bench")
FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
# Our own commands' flags that share a name with one of vLLM's but mean our own thing:
# every server of ours takes --host/--port (loadtest's --host is the target URL); --model is a
# catalog name (serving plan), a source checkpoint (serving model awq), the name to request
# (loadtest); --tokenizer sizes loadtest's prompts.
OURS_ANYWHERE = frozenset({"--host", "--port", "--model", "--tokenizer"})
# ... and these only where named: a key's concurrency limit (`serving keys create`), the
# cross-check's own prompt count.
OURS_IN: dict[str, tuple[str, ...]] = {
    "--max-concurrency": ("serving/gateway/", "bench/gateway_overhead/paths.py"),
    "--num-prompts": ("loadtest/cli.py",),
}


def parse_with_vllm(args: list[str]) -> argparse.Namespace:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = vllm_cli.make_arg_parser(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    namespace: argparse.Namespace = parser.parse_args(args)
    vllm_cli.validate_parsed_serve_args(namespace)
    return namespace


def engine_args_from(namespace: argparse.Namespace) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(namespace)


@pytest.mark.parametrize("profile", load_all_profiles(), ids=lambda p: p.name)
def test_profile_flags_are_accepted_by_vllm(profile: Profile) -> None:
    namespace = parse_with_vllm(engine_args(profile, profile.model, host="127.0.0.1", port=8001))
    built = engine_args_from(namespace)
    assert built.model == profile.model
    assert built.served_model_name in (profile.served_model_name, [profile.served_model_name])
    assert built.tensor_parallel_size == profile.tensor_parallel_size
    assert built.max_model_len == profile.max_model_len
    assert built.max_num_seqs == profile.max_num_seqs
    assert built.kv_cache_dtype == profile.kv_cache_dtype
    assert built.enable_chunked_prefill == profile.enable_chunked_prefill
    assert built.enable_prefix_caching == profile.enable_prefix_caching
    assert built.quantization == (None if profile.quantization == "none" else profile.quantization)
    assert built.enforce_eager == profile.enforce_eager
    assert built.limit_mm_per_prompt == profile.limit_mm_per_prompt
    if profile.device == "gpu":
        assert built.gpu_memory_utilization == profile.gpu_memory_utilization
    assert bool(built.enable_lora) == (profile.lora is not None)
    assert built.scheduling_policy == profile.scheduling_policy


def lora_config_from(namespace: argparse.Namespace) -> Any:
    """vLLM's LoRAConfig as EngineArgs.create_engine_config builds it (its checks run)."""
    from vllm.config.lora import LoRAConfig

    built = engine_args_from(namespace)
    return LoRAConfig(
        max_lora_rank=built.max_lora_rank,
        max_loras=built.max_loras,
        max_cpu_loras=built.max_cpu_loras,
    )


@pytest.mark.parametrize("profile", [p for p in load_all_profiles() if p.lora], ids=str)
def test_lora_profiles_reach_vllms_lora_config(profile: Profile) -> None:
    from vllm.entrypoints.openai.models.protocol import LoRAModulePath

    assert profile.lora is not None
    resolved = {adapter.name: f"/models/{adapter.name}" for adapter in profile.lora.adapters}
    args = engine_args(profile, "m", host="127.0.0.1", port=8001, adapter_paths=resolved)
    namespace = parse_with_vllm(args)
    config = lora_config_from(namespace)
    assert (config.max_loras, config.max_lora_rank) == (
        profile.lora.max_loras,
        profile.lora.max_lora_rank,
    )
    assert config.max_cpu_loras == (profile.lora.max_cpu_loras or profile.lora.max_loras)
    assert namespace.lora_modules == [LoRAModulePath(name, path) for name, path in resolved.items()]
    # Each adapter fits a slot: vLLM refuses a rank above max_lora_rank when it loads one.
    assert all(a.rank <= profile.lora.max_lora_rank for a in profile.lora.adapters)


def test_lora_ranks_are_vllms() -> None:
    import typing

    from vllm.config.lora import MaxLoRARanks

    assert typing.get_args(MaxLoRARanks) == LORA_RANKS


def test_vllm_refuses_what_the_lora_section_refuses() -> None:
    """The profile's LoRA rules are vLLM's: its parser and LoRAConfig refuse the same values."""
    profile = load_profile("cpu-tiny-lora")
    args = engine_args(profile, "m", host="127.0.0.1", port=8001)
    wrong_rank = [*args]
    wrong_rank[wrong_rank.index(engine_flag("max_lora_rank")) + 1] = "7"
    with pytest.raises(SystemExit):
        parse_with_vllm(wrong_rank)
    too_few = [*args, engine_flag("max_cpu_loras"), "1"]
    with pytest.raises(ValueError, match="max_cpu_loras"):
        lora_config_from(parse_with_vllm(too_few))


def test_adapters_render_as_written_until_resolved() -> None:
    profile = load_profile("cpu-tiny-lora")
    args = engine_args(profile, "m", host="127.0.0.1", port=8001)
    modules = args[args.index(engine_flag("lora_modules")) + 1 :]
    assert modules == ["team-a=builtin:qwen3-tiny-lora"]
    resolved = engine_args(
        profile, "m", host="127.0.0.1", port=8001, adapter_paths={"team-a": "/m/lora"}
    )
    assert resolved[-1] == "team-a=/m/lora"
    assert engine_flag("enable_lora") not in engine_args(
        load_profile("cpu-tiny"), "m", host="127.0.0.1", port=8001
    )


def validate_like_the_server(namespace: argparse.Namespace) -> Any:
    """What vLLM's server checks before it loads anything: the tool-call and reasoning parsers
    are registered ones (the reasoning parser as EngineArgs hands it to the config)."""
    from vllm.entrypoints.launchers.launcher import validate_api_server_args

    outputs = engine_args_from(namespace).create_structured_outputs_config()
    validate_api_server_args(  # type: ignore[no-untyped-call]
        argparse.Namespace(**{**vars(namespace), "structured_outputs_config": outputs})
    )
    return outputs


@pytest.mark.parametrize("profile", load_all_profiles(), ids=lambda p: p.name)
def test_profile_tool_and_reasoning_settings_reach_vllm(profile: Profile) -> None:
    namespace = parse_with_vllm(engine_args(profile, profile.model, host="127.0.0.1", port=8001))
    outputs = validate_like_the_server(namespace)
    assert namespace.tool_call_parser == profile.tool_call_parser
    assert namespace.enable_auto_tool_choice == profile.enable_auto_tool_choice
    assert namespace.tool_strict_level == profile.tool_strict_level
    assert outputs.reasoning_parser == (profile.reasoning_parser or "")
    assert outputs.backend == profile.structured_outputs.backend
    assert outputs.disable_any_whitespace == profile.structured_outputs.disable_any_whitespace
    assert (namespace.default_chat_template_kwargs or {}) == profile.default_chat_template_kwargs


# What each model family writes (the format its chat template teaches): Qwen2.5 and Qwen3 JSON
# tool calls in <tool_call> (hermes), Qwen3-Coder and Qwen3.5 XML ones (qwen3_coder); Qwen3 and
# Qwen3.5 think, Qwen3-Coder-Instruct does not. The longest matching prefix names the family.
FAMILY_PARSERS = {
    "Qwen/Qwen2.5-": ("hermes", None),
    "Qwen/Qwen3-": ("hermes", "qwen3"),
    "Qwen/Qwen3-Coder-": ("qwen3_coder", None),
    "Qwen/Qwen3.5-": ("qwen3_coder", "qwen3"),
    "QuantTrio/Qwen3.5-": ("qwen3_coder", "qwen3"),
}
# The project's text-only tiny Qwen3 builds (its template renders tools like Qwen3's).
TINY_TEXT_MODELS = ("builtin:qwen3-tiny", "builtin:qwen3-tiny-awq")


def family_parsers(model: str) -> tuple[str, str | None]:
    if model in TINY_TEXT_MODELS:
        return ("hermes", "qwen3")
    found = [prefix for prefix in FAMILY_PARSERS if model.startswith(prefix)]
    assert found, f"{model}: add its family to FAMILY_PARSERS"
    return FAMILY_PARSERS[max(found, key=len)]


@pytest.mark.parametrize(
    "profile",
    [
        p
        for p in load_all_profiles()
        if p.runner == "generate" and (p.builtin_model is None or p.model in TINY_TEXT_MODELS)
    ],
    ids=lambda p: p.name,
)
def test_every_qwen_profile_parses_its_familys_tool_calls_and_thinking(profile: Profile) -> None:
    assert (profile.tool_call_parser, profile.reasoning_parser) == family_parsers(profile.model)
    assert profile.enable_auto_tool_choice


def test_unregistered_parsers_fail_vllms_server_checks() -> None:
    args = engine_args(load_profile("cpu-tiny"), "m", host="127.0.0.1", port=8001)
    for flag in (engine_flag("tool_call_parser"), engine_flag("reasoning_parser")):
        wrong = [*args]
        wrong[wrong.index(flag) + 1] = "qwen9"
        with pytest.raises(KeyError, match="qwen9"):
            validate_like_the_server(parse_with_vllm(wrong))


def test_a_wrong_flag_fails_in_vllms_parser() -> None:
    args = engine_args(load_profile("cpu-tiny"), "m", host="127.0.0.1", port=8001)
    with pytest.raises(SystemExit):
        parse_with_vllm([*args, "--swap-space-that-does-not-exist", "4"])
    bad_choice = [a if a != "auto" else "fp7" for a in args]
    with pytest.raises(SystemExit):
        parse_with_vllm(bad_choice)


def test_render_binds_loopback_and_stays_offline_for_builtin_models() -> None:
    command = render(load_profile("cpu-tiny"), "/models/tiny", port=9001)
    assert command.argv[1:3] == ["-m", VLLM_SERVER_MODULE]
    host = command.argv[command.argv.index("--host") + 1]
    assert host == "127.0.0.1"
    assert command.argv[command.argv.index("--port") + 1] == "9001"
    assert command.env["HF_HUB_OFFLINE"] == "1"
    assert command.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_tp2_profile_binds_one_core_per_rank() -> None:
    command = render(load_profile("cpu-tiny-tp2"), "/models/tiny")
    assert command.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "--distributed-executor-backend" in command.argv


def test_every_engine_flag_is_one_vllms_server_takes() -> None:
    profile = load_profile("cpu-tiny").model_copy(
        update={
            "device": "gpu",
            "gpu": "rtx-4090",
            "tokenizer": "tok",
            "quantization": "awq",
            "distributed_executor_backend": "mp",
            "pipeline_parallel_size": 2,
            "max_num_batched_tokens": 4096,
            "block_size": 32,
            "enforce_eager": True,
            "cpu_offload_gb": 1.5,
            "kv_offloading_size_gib": 2.0,
            "kv_cache_memory_bytes": 9 << 20,
            "limit_mm_per_prompt": {"image": 4, "video": 0},
            "tool_strict_level": "parameter",
            "scheduling_policy": "priority",
            "lora": Lora(
                max_loras=4,
                max_lora_rank=16,
                max_cpu_loras=8,
                adapters=(
                    LoraAdapter(name="a", path="/lora/a", rank=8),
                    # A comma: only the JSON form of --lora-modules keeps this path whole.
                    LoraAdapter(name="b", path="/lora/b,c", rank=16),
                ),
            ),
        }
    )
    args = [*engine_args(profile, "m", host="127.0.0.1", port=8001)]
    args.append(engine_flag("language_model_only"))
    generating = set(ENGINE_FLAGS.values()) - {engine_flag(name) for name in POOLING_FIELDS}
    assert generating <= set(args), "a flag in the table is never rendered here"
    namespace = parse_with_vllm(args)
    expected = {**profile.model_dump(), "model": "m", "language_model_only": True}
    expected.update(host="127.0.0.1", port=8001, kv_offloading_size=2.0)
    expected["served_model_name"] = [profile.served_model_name]  # vLLM's takes several
    expected["structured_outputs_config"] = profile.structured_outputs.model_dump()
    expected.update(enable_lora=True, max_loras=4, max_lora_rank=16, max_cpu_loras=8)
    from vllm.entrypoints.openai.models.protocol import LoRAModulePath

    expected["lora_modules"] = [LoRAModulePath("a", "/lora/a"), LoRAModulePath("b", "/lora/b,c")]
    for name in ENGINE_FLAGS.keys() - POOLING_FIELDS:
        dest = {
            "kv_offloading_size_gib": "kv_offloading_size",
            "structured_outputs": "structured_outputs_config",
        }.get(name, name)
        value = getattr(namespace, dest)
        if dest == "structured_outputs_config":  # vLLM's config object: compare our fields
            value = {key: getattr(value, key) for key in expected[dest]}
        assert value == expected[dest], name


# The fields only a pooling profile renders (test_pooling_flags_reach_vllms_engine_args).
POOLING_FIELDS = frozenset({"runner", "convert", "pooler_config", "hf_overrides", "chat_template"})


def test_pooling_flags_reach_vllms_engine_args() -> None:
    overrides = {"architectures": ["Qwen3ForSequenceClassification"], "is_original": True}
    profile = load_profile("cpu-tiny-embedding").model_copy(
        update={"hf_overrides": overrides, "chat_template": "builtin:qwen3-reranker"}
    )
    args = engine_args(profile, "m", host="127.0.0.1", port=8001)
    assert {engine_flag(name) for name in POOLING_FIELDS} <= set(args)
    namespace = parse_with_vllm(args)
    built = engine_args_from(namespace)
    assert (built.runner, built.convert) == ("pooling", "embed")
    assert built.hf_overrides == overrides
    assert built.pooler_config.seq_pooling_type == "LAST"
    assert built.pooler_config.use_activation is True
    template = Path(namespace.chat_template)  # the server's own argument, not the engine's
    assert template.is_file() and template.name == "qwen3-reranker.jinja"


def test_an_inlined_template_is_the_one_vllm_loads_from_the_file() -> None:
    """For an engine elsewhere (a pod) the template goes as its text, which vLLM's loader
    takes as the template itself: the same one it reads from the shipped file here."""
    from vllm.renderers.chat_utils import load_chat_template

    profile = load_profile("cpu-tiny-reranker")
    here = parse_with_vllm(engine_args(profile, "m", host="127.0.0.1", port=8001))
    elsewhere = engine_args(profile, "m", host="127.0.0.1", port=8001, inline_templates=True)
    inlined = parse_with_vllm(elsewhere).chat_template
    assert inlined.startswith("<|im_start|>system\n") and "<Document>" in inlined
    assert load_chat_template(inlined) == load_chat_template(here.chat_template) == inlined


def test_a_generating_profile_renders_no_pooling_flag() -> None:
    args = engine_args(load_profile("cpu-tiny"), "m", host="127.0.0.1", port=8001)
    assert not {engine_flag(name) for name in POOLING_FIELDS} & set(args)
    assert engine_args_from(parse_with_vllm(args)).runner == "auto"


def test_bench_args_are_what_vllm_bench_serve_parses() -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    bench = BenchServe(
        backend="openai-chat",
        base_url="http://127.0.0.1:8001",
        endpoint="/v1/chat/completions",
        model="m",
        served_model_name="served",
        tokenizer="/tok",
        dataset_name="custom",
        dataset_path="/prompts.jsonl",
        custom_output_len=-1,
        skip_chat_template=True,
        num_prompts=64,
        max_concurrency=4,
        request_rate=math.inf,
        temperature=0.0,
        disable_tqdm=True,
        percentile_metrics="ttft,tpot,itl,e2el",
        ignore_eos=True,
    )
    assert list(BENCH_FLAGS) == list(asdict(bench))
    parser = FlexibleArgumentParser(prog="vllm bench serve")  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    args = bench_serve_args(bench)
    assert args[args.index("--temperature") + 1] == "0"
    assert args[args.index("--request-rate") + 1] == "inf"
    assert vars(parser.parse_args(args)).items() >= asdict(bench).items()
    unset = bench_serve_args(BenchServe(**{**asdict(bench), "ignore_eos": False}))
    assert unset == [a for a in args if a != "--ignore-eos"]


def vllm_flags() -> set[str]:
    """Every vLLM flag this module knows: its tables, and any flag literal in its source."""
    source = Path(flags.__file__).read_text(encoding="utf-8")
    literals = re.findall(r"""["'](--[a-z0-9][a-z0-9-]*[a-z0-9])["'\s]""", source)
    known = {*ENGINE_FLAGS.values(), *BENCH_FLAGS.values(), *literals}
    return known | {negated(flag) for flag in known}


def spelled(text: str, known: set[str]) -> list[tuple[int, str]]:
    """(line, flag) for each known flag `text` spells, in strings, comments or docstrings."""
    return [
        (number, flag)
        for number, line in enumerate(text.splitlines(), start=1)
        for flag in FLAG.findall(line)
        if flag in known
    ]


def ours(flag: str, relative: str) -> bool:
    return flag in OURS_ANYWHERE or any(relative.startswith(p) for p in OURS_IN.get(flag, ()))


def test_no_other_module_spells_a_vllm_flag() -> None:
    known = vllm_flags()
    assert {"--max-model-len", "--no-enable-prefix-caching", "--request-rate"} <= known
    assert spelled('f"--kv-cache-dtype fp8 --max-model-lens"', known) == [(1, "--kv-cache-dtype")]
    found = []
    for top in SOURCE_DIRS:
        for path in sorted((REPO / top).rglob("*.py")):
            if path.resolve() == Path(flags.__file__).resolve():
                continue
            if any(part.startswith(".") for part in path.relative_to(REPO).parts):
                continue  # bench/.venvs and other tool directories: not the project's code
            relative = path.relative_to(REPO).as_posix()
            for number, flag in spelled(path.read_text(encoding="utf-8"), known):
                if not ours(flag, relative):
                    found.append(f"{relative}:{number}: {flag}")
    assert not found, (
        "vLLM flag names belong to serving/vllm_flags.py (engine_flag, bench_serve_args): "
        + "; ".join(found)
    )
