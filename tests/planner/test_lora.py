"""The LoRA buffers the planner adds (serving/planner/lora.py), by hand for small shapes, and
how a plan shows them and says when they are why it does not fit. Held against the buffers a
running vLLM allocates in tests/integration/tenants/test_lora.py."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from serving.cli import main
from serving.errors import ServingError
from serving.models.cached_build import Progress
from serving.models.tiny_model import ensure_tiny_model
from serving.planner import PlanSettings, evaluate, get_gpu, plan_for, resolve_model
from serving.planner.lora import LoraBytes, decoder_layer_elements, lora_bytes
from serving.planner.models import ModelSpec
from serving.planner.profile_plan import profile_plan, profile_settings
from serving.planner.render import plan_to_dict, render_table
from serving.profiles import load_profile

# The tiny Qwen3's shapes (serving/models/tiny_model.py).
TINY = ModelSpec(
    name="tiny", layers=4, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=768,
    vocab=2112, tied_embeddings=True, max_positions=4096, qk_norm=True, lora_embeddings=True,
)  # fmt: skip
RTX4090 = get_gpu("rtx-4090")
ADAPTERS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"
GPU_LORA = PlanSettings(max_model_len=8192, enable_lora=True, max_loras=4, max_lora_rank=64)


def test_the_tiny_models_buffers_by_hand() -> None:
    # One slot, one layer, rank 8, values: A is rank x in, B is out x rank, per slice.
    qkv = 3 * 8 * 256 + 8 * (256 + 128 + 128)  # q, k, v slices: A 8x256 each; B 256|128|128 x 8
    o_proj = 8 * 256 + 256 * 8
    gate_up = 2 * 8 * 256 + 2 * 768 * 8
    down = 8 * 768 + 256 * 8
    assert decoder_layer_elements(TINY, 1, 8) == qkv + o_proj + gate_up + down == 38_912
    # Two slots of bf16, four layers; the embedding (A: vocab x rank, B: hidden x rank) and the
    # logits (A: rank x hidden, B: vocab x rank), because vLLM's Qwen3 names them LoRA modules.
    embedding = 2 * 2 * (2112 * 8 + 256 * 8)
    assert lora_bytes(TINY, 1, max_loras=2, max_lora_rank=8, dtype_bytes=2) == LoraBytes(
        decoder=2 * 2 * 4 * 38_912, embedding=embedding, lm_head=embedding
    )
    assert profile_plan(load_profile("cpu-tiny-lora")).lora.total == 622_592 + 2 * 75_776


def test_tensor_parallelism_shards_them_like_their_layers() -> None:
    # TP 2: q 128, k and v 64 each, o's input 128, gate/up 384 each, down's input 384.
    assert decoder_layer_elements(TINY, 2, 8) == (
        3 * 8 * 256 + 8 * (128 + 64 + 64) + 8 * 128 + 256 * 8 + 2 * 8 * 256 + 2 * 384 * 8
        + 8 * 384 + 256 * 8
    ) == 26_624  # fmt: skip
    # TP 4 with 2 KV heads: each GPU holds one replicated KV head (64 values of k and of v).
    assert decoder_layer_elements(TINY, 4, 8) == (
        3 * 8 * 256 + 8 * (64 + 64 + 64) + 8 * 64 + 256 * 8 + 2 * 8 * 256 + 2 * 192 * 8
        + 8 * 192 + 256 * 8
    ) == 20_992  # fmt: skip
    # The embedding's and the logits' buffers are whole on every rank.
    sharded = lora_bytes(TINY, 2, max_loras=2, max_lora_rank=8, dtype_bytes=2)
    assert (sharded.embedding, sharded.lm_head) == (75_776, 75_776)


def test_qwen2_wraps_no_embeddings_and_stages_split_them() -> None:
    qwen2 = replace(TINY, lora_embeddings=False)
    assert lora_bytes(qwen2, 1, max_loras=2, max_lora_rank=8, dtype_bytes=2).total == 622_592
    spec = resolve_model("Qwen3-8B")
    whole = lora_bytes(spec, 1, max_loras=1, max_lora_rank=16, dtype_bytes=2)
    plan = evaluate(
        spec,
        RTX4090,
        replace(GPU_LORA, max_loras=1, max_lora_rank=16, pipeline_parallel_size=2, gpu_count=2),
    )
    first, last = plan.stages
    assert first.lora_bytes == whole.decoder // 2 + whole.embedding
    assert last.lora_bytes == whole.decoder // 2 + whole.lm_head


def test_on_a_gpu_they_come_out_of_the_kv_cache() -> None:
    spec = resolve_model("Qwen3-8B")  # 36 layers, hidden 4096, 32/8 heads of 128, 12288, vocab
    per_slot_layer = (
        3 * 64 * 4096 + 64 * (4096 + 1024 + 1024) + 64 * 4096 + 4096 * 64
        + 2 * 64 * 4096 + 2 * 12288 * 64 + 64 * 12288 + 4096 * 64
    )  # fmt: skip
    embedding = 4 * 2 * 64 * (151_936 + 4096)
    expected = 4 * 2 * 36 * per_slot_layer + 2 * embedding
    with_lora = evaluate(spec, RTX4090, GPU_LORA)
    without = evaluate(spec, RTX4090, replace(GPU_LORA, enable_lora=False))
    assert with_lora.lora.total == expected == 1_556_480_000
    assert without.kv_available_bytes - with_lora.kv_available_bytes == expected
    assert without.lora.total == 0 and with_lora.fits


def test_on_the_cpu_engine_they_sit_beside_the_fixed_kv_space() -> None:
    lora, plain = (profile_plan(load_profile(name)) for name in ("cpu-tiny-lora", "cpu-tiny"))
    assert lora.kv_available_bytes == plain.kv_available_bytes
    assert lora.capacity == plain.capacity
    table = render_table(lora)
    assert "  LoRA buffers (2 x rank 8, outside it)         0.00  (0.7 MiB)\n" in table
    assert "LoRA" not in render_table(plain)
    data = plan_to_dict(lora)
    assert data["per_gpu"]["lora_bytes"] == 774_144
    assert data["per_gpu"]["lora"] == {"decoder": 622_592, "embedding": 75_776, "lm_head": 75_776}
    assert data["settings"]["enable_lora"] is True
    assert data["stages"][0]["lora_bytes"] == 774_144


@pytest.mark.parametrize(
    ("loras", "rank", "max_model_len", "code", "words", "fix"),
    [
        # 11.6 GiB of buffers beside 15.3 GiB of weights on a 21.3 GiB budget.
        (8, 256, 8192, "lora", "the LoRA buffers (max_loras 8 x rank 256: 11.60 GiB per GPU) "
         "do not fit beside the weights", "--max-loras 1"),
        # 5.8 GiB: more than the 5.1 GiB the KV cache would have had.
        (4, 256, 8192, "memory", "the LoRA buffers (max_loras 4 x rank 256: 5.80 GiB per GPU) "
         "take the memory the KV cache would have had", "--max-loras 1"),
        # 1.45 GiB: a 32K sequence (4.5 GiB of KV) fits without them, not with them; an fp8
        # KV cache is the cheaper fix.
        (4, 64, 32768, "kv", "GiB is available: the LoRA buffers (max_loras 4 x rank 64: 1.45 "
         "GiB per GPU) take the rest", "--kv-cache-dtype fp8"),
    ],
)  # fmt: skip
def test_a_plan_says_when_the_lora_buffers_are_why_it_does_not_fit(
    loras: int, rank: int, max_model_len: int, code: str, words: str, fix: str
) -> None:
    spec = resolve_model("Qwen3-8B")
    settings = replace(GPU_LORA, max_loras=loras, max_lora_rank=rank, max_model_len=max_model_len)
    plan = plan_for(spec, RTX4090, settings)
    assert plan.binding is not None and plan.binding.code == code
    assert words in plan.binding.message, plan.binding.message
    assert evaluate(spec, RTX4090, replace(settings, enable_lora=False)).fits
    assert plan.suggestion is not None and plan.suggestion.change == fix
    assert "LoRA buffers (" in render_table(plan)


def test_hybrid_and_moe_models_are_noted_not_planned() -> None:
    plan = evaluate(resolve_model("Qwen3.5-9B"), RTX4090, replace(GPU_LORA, max_model_len=4096))
    assert plan.lora.total == 0
    assert any("planned for dense models only: hybrid Qwen3.5-9B" in note for note in plan.notes)


def test_profiles_carry_their_limits_and_bad_limits_name_the_flag() -> None:
    settings = profile_settings(load_profile("cpu-tiny-lora"))
    assert (settings.enable_lora, settings.max_loras, settings.max_lora_rank) == (True, 2, 8)
    assert not profile_settings(load_profile("cpu-tiny")).enable_lora
    with pytest.raises(ServingError, match=r"^--max-lora-rank: 7 is not one of vLLM's \(1, 8"):
        evaluate(TINY, get_gpu("cpu"), replace(settings, max_lora_rank=7))
    with pytest.raises(ServingError, match=r"^--max-loras: must be >= 1, got 0"):
        evaluate(TINY, get_gpu("cpu"), replace(settings, max_loras=0))


def test_serving_plan_takes_vllms_lora_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "Qwen3-8B", "--gpu", "rtx-4090", "--max-model-len", "8192"]
    assert main([*args, "--max-loras", "4", "--max-lora-rank", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["enable_lora"] and data["per_gpu"]["lora_bytes"] == 1_556_480_000
    assert main([*args, "--enable-lora"]) == 0  # vLLM's defaults: one slot of rank 16
    assert "LoRA buffers (1 x rank 16)" in capsys.readouterr().out


def quoted_plans() -> list[tuple[str, list[str]]]:
    """Each `serving plan` run docs/adapters.md quotes: its command and the lines it shows."""
    blocks = re.findall(r"^```\n(\$ .*?)^```", ADAPTERS_PAGE.read_text(), re.M | re.S)
    return [(block.splitlines()[0], block.splitlines()[1:]) for block in blocks]


@pytest.mark.parametrize(("command", "lines"), quoted_plans(), ids=lambda v: str(v)[:60])
def test_the_plans_quoted_in_adapters_md_are_what_serving_plan_prints(
    command: str, lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    words = shlex.split(command.removeprefix("$ "))
    assert words[0] == ".venv/bin/serving"
    # The profile's model is read from its build (built by `make up` before a reader runs
    # this): built here, not left to whichever test happened to build it first.
    ensure_tiny_model(progress=Progress(quiet=True))
    assert main(words[1:]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert lines and all(line in printed for line in lines), (lines, printed)


def test_both_runs_are_quoted() -> None:
    runs = [shlex.split(command)[3:5] for command, _ in quoted_plans()]
    assert runs == [["--profile", "cpu-tiny-lora"], ["--model", "Qwen3-8B"]]
