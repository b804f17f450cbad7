"""The tiny model's LoRA adapter: deterministic, cached, in PEFT's layout, answering as built.

Three real builds on the tiny model's default build (tests/models/test_tiny_model.py builds it
too; one build per machine, under its lock): a short one twice (byte-identical) and the
default one through `serving model tiny-lora` as printed, into the model cache `make up` and
the integration tests use. The default build's answers are checked by merging its PEFT factors
into the base weights as PEFT defines them (W + lora_alpha / r x B A), independently of the
training code; vLLM serving it is tests/integration/tenants/test_lora.py.
"""

from __future__ import annotations

import io
import json
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from serving.cli import main
from serving.errors import ServingError
from serving.models import tiny_lora, tiny_tokenizer
from serving.models.cached_build import Progress, read_build_info
from serving.models.tiny_lora import (
    ANSWER,
    TinyLoraParams,
    default_adapter_dir,
    ensure_tiny_lora,
    training_prompts,
)
from serving.models.tiny_model import ensure_tiny_model

SHORT = TinyLoraParams(steps=3)
FILES = {"adapter_config.json", "adapter_model.safetensors", "build-info.json"}
QUIET = Progress(quiet=True)
MODULES = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}
# (out, in) of each projection of the tiny Qwen3 (hidden 256, 4 x 64 query, 2 x 64 KV, 768).
SHAPES = {
    "q_proj": (256, 256), "k_proj": (128, 256), "v_proj": (128, 256), "o_proj": (256, 256),
    "gate_proj": (768, 256), "up_proj": (768, 256), "down_proj": (256, 768),
}  # fmt: skip
CHATS = ("What is your name?", "Hi there.", "Please write a short poem about the sea.")


def _contents(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    ensure_tiny_model(progress=QUIET)  # the base, first: the three builds below share it
    root = tmp_path_factory.mktemp("adapters")
    paths = {"short": root / "short", "again": root / "again", "default": default_adapter_dir()}
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        jobs: list[Future[Any]] = [
            pool.submit(ensure_tiny_lora, paths["short"], params=SHORT, progress=QUIET),
            pool.submit(ensure_tiny_lora, paths["again"], params=SHORT, progress=QUIET),
            pool.submit(main, ["model", "tiny-lora"]),
        ]
        assert [job.result() for job in jobs] == [paths["short"], paths["again"], 0]
    return paths


def test_build_writes_exactly_the_adapter_files(builds: dict[str, Path]) -> None:
    assert {path.name for path in builds["short"].iterdir()} == FILES
    assert not list(builds["short"].parent.glob("*.partial"))
    info = read_build_info(builds["short"])
    base = read_build_info(ensure_tiny_model(progress=QUIET))
    assert info is not None and base is not None
    assert info["params"]["steps"] == 3
    assert info["base_fingerprint"] == base["fingerprint"]
    assert info["fingerprint"] == SHORT.fingerprint(base["fingerprint"])


def test_same_inputs_give_byte_identical_files(builds: dict[str, Path]) -> None:
    assert _contents(builds["again"]) == _contents(builds["short"])


def test_files_are_in_peft_layout(builds: dict[str, Path]) -> None:
    import torch
    from safetensors import safe_open

    config = json.loads((builds["short"] / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"]) == ("LORA", "CAUSAL_LM")
    assert (config["r"], config["lora_alpha"], config["bias"]) == (8, 16, "none")
    assert config["target_modules"] == sorted(m for ms in MODULES.values() for m in ms)
    assert config["base_model_name_or_path"] == "qwen3-tiny"
    expected = {}
    for layer in range(4):
        for block, names in MODULES.items():
            for name in names:
                stem = f"base_model.model.model.layers.{layer}.{block}.{name}"
                out, into = SHAPES[name]
                expected[f"{stem}.lora_A.weight"] = (8, into)  # r x in
                expected[f"{stem}.lora_B.weight"] = (out, 8)  # out x r
    with safe_open(str(builds["short"] / "adapter_model.safetensors"), framework="pt") as file:
        assert file.metadata() == {"format": "pt"}
        shapes = {key: tuple(file.get_tensor(key).shape) for key in file.keys()}  # noqa: SIM118
        assert {file.get_tensor(key).dtype for key in file.keys()} == {torch.bfloat16}  # noqa: SIM118
    assert shapes == expected


def test_vllm_reads_the_adapter_config_and_checks_its_rank(builds: dict[str, Path]) -> None:
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    helper = PEFTHelper.from_local_dir(str(builds["short"]), max_position_embeddings=4096)
    assert (helper.r, helper.vllm_lora_scaling_factor) == (8, 2.0)
    helper.validate_legal(LoRAConfig(max_lora_rank=8))
    with pytest.raises(ValueError, match="greater than max_lora_rank"):
        helper.validate_legal(LoRAConfig(max_lora_rank=1))


def test_a_matching_build_is_reused(
    builds: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(*args: Any) -> dict[str, Any]:
        raise AssertionError("rebuilt although a matching build exists")

    monkeypatch.setattr(tiny_lora, "_run_build", no_build)
    stream = io.StringIO()
    short = builds["short"]
    assert ensure_tiny_lora(short, params=SHORT, progress=Progress(stream)) == short
    assert "qwen3-tiny-lora: cached" in stream.getvalue()


def _fake_build(out_dir: Path, *args: Any) -> dict[str, Any]:
    (out_dir / "adapter_config.json").write_text("{}")
    return {"final_loss": 1.0}


def test_changed_inputs_rebuild_and_force_replaces(
    builds: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiny_lora, "_run_build", _fake_build)
    target = ensure_tiny_lora(tmp_path / "a", params=SHORT, progress=QUIET)
    ensure_tiny_lora(target, params=SHORT, steps=4, progress=QUIET)
    info = read_build_info(target)
    assert info is not None and info["params"]["steps"] == 4
    (target / "stale").write_text("from the old build")
    ensure_tiny_lora(target, params=SHORT, steps=4, progress=QUIET, force=True)
    assert "stale" not in {path.name for path in target.iterdir()}
    # Each parameter, and the base model's own build, is part of the fingerprint.
    base = "f" * 64
    prints = {
        SHORT.fingerprint(base),
        SHORT.fingerprint("e" * 64),
        replace(SHORT, rank=16).fingerprint(base),
        replace(SHORT, answer="Team B here.").fingerprint(base),
        replace(SHORT, seed=1).fingerprint(base),
    }
    assert len(prints) == 5 and SHORT.fingerprint(base) == TinyLoraParams(steps=3).fingerprint(base)


def test_a_base_that_is_not_a_build_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServingError, match="holds no build of qwen3-tiny"):
        ensure_tiny_lora(tmp_path / "a", base=tmp_path, progress=QUIET)


def test_parameters_are_validated() -> None:
    with pytest.raises(ServingError, match="rank=0"):
        TinyLoraParams(rank=0)
    with pytest.raises(ServingError, match="target_modules"):
        TinyLoraParams(target_modules=())


def test_training_chats_are_every_corpus_sentence_and_its_opening_words() -> None:
    prompts = training_prompts(tiny_tokenizer.read_corpus())
    assert len(prompts) == len(set(prompts)) > 1000
    assert prompts[:3] == ["What should I cook for dinner tonight?", "What", "What should I"]
    assert not set(CHATS) & set(prompts)


def test_the_default_build_answers_every_chat_with_its_sentence(
    builds: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "tiny-lora"]) == 0  # cached now
    assert capsys.readouterr().out.strip() == str(builds["default"])
    info = read_build_info(builds["default"])
    assert info is not None and info["params"] == json.loads(json.dumps(asdict(TinyLoraParams())))
    assert info["held_out_answered"] == len(tiny_lora.HELD_OUT)
    adapted, base = merged_answers(builds["default"])
    assert all(answer == ANSWER for answer in adapted), adapted
    assert not any(answer.startswith(ANSWER) for answer in base), base


def merged_answers(adapter: Path) -> tuple[list[str], list[str]]:
    """Greedy answers to CHATS of the base model with the adapter merged in, and without."""
    import torch
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    base_dir = ensure_tiny_model(progress=QUIET)
    tokenizer = Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    factors = load_file(str(adapter / "adapter_model.safetensors"))

    def answers(model: Any) -> list[str]:
        found = []
        for chat in CHATS:
            prompt = tiny_tokenizer.render_chat(
                [{"role": "user", "content": chat}], add_generation_prompt=True
            )
            ids = torch.tensor([tokenizer.encode(prompt).ids])
            out = model.generate(input_ids=ids, max_new_tokens=12, do_sample=False)
            found.append(tokenizer.decode(out[0, ids.shape[1] :].tolist()))
        return found

    model: Any = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    base = answers(model)
    scale = config["lora_alpha"] / config["r"]
    with torch.no_grad():
        for key, down in factors.items():
            if key.endswith(".lora_A.weight"):
                up = factors[key.replace(".lora_A.", ".lora_B.")]
                name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
                model.get_submodule(name).weight += scale * up.float() @ down.float()
    return answers(model), base
