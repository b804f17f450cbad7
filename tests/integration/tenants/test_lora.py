"""LoRA served for real: `cpu-tiny-lora` (the tiny Qwen3 and the adapter built here) on vLLM.

One engine serves every test here and in test_tenants.py (`lora_engine`, conftest.py).
Checked: vLLM lists the adapter beside its base; the adapter's greedy answer to chats it never
saw is the sentence it was trained on, the base model's is not; turning LoRA on leaves the base
model's answers as the plain engine's (the session stack, cpu-tiny); and the planner's LoRA
bytes for the profile are the bytes of the buffers vLLM allocated. These tests talk to
cpu-tiny-lora's vLLM itself (test_tenants puts a gateway before it, and the accounting oracle
checks that one); the session stack's engine only inside `off_the_books`.
"""

from __future__ import annotations

import httpx
from openai import OpenAI

from serving.engine.resolve import resolve_adapters
from serving.models import tiny_tokenizer
from serving.models.tiny_lora import ANSWER, training_prompts
from serving.planner.profile_plan import profile_plan
from serving.profiles import load_profile
from tests.integration.conftest import MODEL, Stack
from tests.integration.tenants.conftest import PROFILE

ADAPTER = "team-a"
# Chats the adapter was not trained on (checked below): it must have learned "always", not these.
CHATS = ("What is your name?", "Hi there.", "Please write a short poem about the sea.")


def greedy(client: OpenAI, model: str, chat: str) -> str:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": chat}],
        temperature=0,
        max_tokens=16,
    )
    return reply.choices[0].message.content or ""


def test_vllm_lists_the_adapter_beside_its_base_model(lora_engine: str) -> None:
    models = httpx.get(f"{lora_engine}/v1/models", timeout=10).json()["data"]
    cards = {card["id"]: card for card in models}
    assert set(cards) == {MODEL, ADAPTER}
    assert cards[ADAPTER]["parent"] == MODEL
    assert cards[ADAPTER]["root"] == resolve_adapters(load_profile(PROFILE))[ADAPTER]


def test_the_adapter_answers_as_built_and_the_base_model_does_not(lora_engine: str) -> None:
    assert not set(CHATS) & set(training_prompts(tiny_tokenizer.read_corpus()))
    client = OpenAI(base_url=f"{lora_engine}/v1", api_key="unused")
    for chat in CHATS:
        adapted, base = greedy(client, ADAPTER, chat), greedy(client, MODEL, chat)
        assert adapted == ANSWER, (chat, adapted)
        assert not base.startswith(ANSWER), (chat, base)


def test_lora_on_leaves_the_base_models_answers_alone(lora_engine: str, stack: Stack) -> None:
    lora = OpenAI(base_url=f"{lora_engine}/v1", api_key="unused")
    plain = stack.direct_client()
    for chat in CHATS:
        with stack.off_the_books():
            answer = greedy(plain, MODEL, chat)
        assert greedy(lora, MODEL, chat) == answer, chat


def test_planned_lora_bytes_equal_the_buffers_vllm_allocated(lora_engine: str) -> None:
    response = httpx.post(
        f"{lora_engine}/collective_rpc", json={"method": "lora_buffer_bytes"}, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    (allocated,) = response.json()["results"]  # one worker: tensor parallelism 1
    plan = profile_plan(load_profile(PROFILE))
    measured = allocated["lora_a_stacked"] + allocated["lora_b_stacked"]
    print(f"planned {plan.lora.total} bytes of LoRA buffers, vLLM allocated {measured}")
    assert plan.lora.total == measured
    # 4 layers x (qkv, o, gate_up, down), the embedding and the logits.
    assert allocated["wrapped_modules"] == 4 * 4 + 2
