from __future__ import annotations

from pathlib import Path

from loadtest.prompts import Tokenizer, generate_prompts, read_prompts, write_prompts
from loadtest.workload import load_workload


def test_prompts_have_the_requested_size_in_model_tokens(tokenizer: Tokenizer) -> None:
    prompts = generate_prompts(load_workload("short-chat"), tokenizer, max_model_len=2048)
    assert len(prompts) == 200
    assert {p.prompt_tokens for p in prompts} == {64}
    assert {p.output_tokens for p in prompts} == {32}
    # prompt_tokens is what the engine counts: the user turn with the chat template.
    sample = prompts[0]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": sample.prompt}], add_generation_prompt=True, tokenize=False
    )
    assert len(tokenizer.encode(str(rendered), add_special_tokens=False)) == 64


def test_generation_is_deterministic_per_seed(tokenizer: Tokenizer) -> None:
    workload = load_workload("mixed")
    first = generate_prompts(workload, tokenizer, max_model_len=2048)
    again = generate_prompts(workload, tokenizer, max_model_len=2048)
    other = generate_prompts(
        workload.model_copy(update={"seed": 99}), tokenizer, max_model_len=2048
    )
    assert first == again
    assert [p.prompt for p in first] != [p.prompt for p in other]
    assert {p.scenario for p in first} == {"chat", "chat-eos", "long", "rag"}


def test_ranged_and_long_lengths_stay_in_range(tokenizer: Tokenizer) -> None:
    prompts = generate_prompts(load_workload("long-context"), tokenizer, max_model_len=2048)
    assert all(1536 - 2 <= p.prompt_tokens <= 1843 + 2 for p in prompts)
    assert all(p.prompt_tokens + p.output_tokens <= 2048 for p in prompts)


def test_shared_prefix_groups_share_their_first_tokens(tokenizer: Tokenizer) -> None:
    prompts = generate_prompts(load_workload("shared-prefix"), tokenizer, max_model_len=2048)
    starts = {p.prompt[:400] for p in prompts}
    assert len(starts) == 4  # four distinct prefixes, each shared by many prompts
    assert {p.prompt_tokens for p in prompts} == {576}


def test_prompts_file_round_trips_in_vllm_custom_format(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    prompts = generate_prompts(load_workload("short-chat"), tokenizer, max_model_len=2048)
    path = tmp_path / "p.jsonl"
    write_prompts(prompts, path)
    assert read_prompts(path) == prompts
    first = path.read_text().splitlines()[0]
    assert '"prompt": ' in first and '"output_tokens": 32' in first
