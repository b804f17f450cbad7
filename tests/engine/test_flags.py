"""Every shipped profile renders to flags that vLLM's own parser and EngineArgs accept."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
import vllm.entrypoints.launchers.cli_args as vllm_cli

from serving.engine.flags import VLLM_SERVER_MODULE, engine_args, render
from serving.profiles import Profile, load_all_profiles, load_profile


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
    if profile.device == "gpu":
        assert built.gpu_memory_utilization == profile.gpu_memory_utilization


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
