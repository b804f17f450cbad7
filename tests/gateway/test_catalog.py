"""The model catalog: context windows and a bounded `model` label."""

from __future__ import annotations

from serving.gateway.catalog import OTHER_MODEL, ModelCatalog


def test_listed_models_have_windows_and_their_own_label() -> None:
    catalog = ModelCatalog()
    catalog.update({"qwen": 4096, "lora": None})
    assert catalog.context_window("qwen") == 4096
    assert catalog.context_window("lora") is None
    assert catalog.label("qwen") == "qwen"
    assert catalog.label("made-up") == OTHER_MODEL


def test_learned_models_are_bounded() -> None:
    catalog = ModelCatalog()
    for index in range(ModelCatalog.MAX_LEARNED + 10):
        catalog.learn(f"m{index}")
    assert catalog.label("m0") == "m0"
    assert catalog.label(f"m{ModelCatalog.MAX_LEARNED}") == OTHER_MODEL
    assert catalog.context_window("m0") is None
