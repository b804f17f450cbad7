"""The model catalog: per-engine lists, adapters, context windows and a bounded label."""

from __future__ import annotations

from serving.gateway.catalog import OTHER_MODEL, ModelCatalog, ModelInfo


def _info(name: str, window: int | None, parent: str | None = None) -> ModelInfo:
    return ModelInfo(window=window, parent=parent, entry={"id": name, "parent": parent})


BASE = {"qwen": _info("qwen", 4096)}
WITH_ADAPTER = {**BASE, "team-a": _info("team-a", None, parent="qwen")}


def test_listed_models_have_windows_and_their_own_label() -> None:
    catalog = ModelCatalog()
    assert not catalog.known
    catalog.update(0, WITH_ADAPTER)
    assert catalog.known
    assert catalog.context_window("qwen") == 4096
    assert catalog.context_window("team-a") == 4096  # an adapter has its base's window
    assert catalog.context_window("made-up") is None
    assert catalog.label("qwen") == "qwen" and catalog.label("team-a") == "team-a"
    assert catalog.label("made-up") == OTHER_MODEL


def test_adapters_know_their_base_and_bases_are_bases() -> None:
    catalog = ModelCatalog()
    catalog.update(0, WITH_ADAPTER)
    assert catalog.base_model("team-a") == "qwen"
    assert catalog.base_model("qwen") is None
    assert catalog.is_base("qwen") and not catalog.is_base("team-a")
    assert not catalog.is_base("made-up")


def test_each_engine_lists_its_own_models() -> None:
    catalog = ModelCatalog()
    catalog.update(3, BASE)
    catalog.update(7, WITH_ADAPTER)
    assert catalog.engines_serving("qwen") == frozenset({3, 7})
    assert catalog.engines_serving("team-a") == frozenset({7})
    assert catalog.engines_serving("made-up") is None  # any engine may answer
    catalog.update(7, BASE)  # the adapter was unloaded there
    assert catalog.engines_serving("team-a") is None
    assert catalog.label("team-a") == OTHER_MODEL
    catalog.update(7, WITH_ADAPTER)
    catalog.retain([3])  # engine 7 left
    assert catalog.engines_serving("team-a") is None
    assert catalog.models_of(7) is None and catalog.models_of(3) == BASE


def test_the_listing_is_filtered_by_the_key() -> None:
    catalog = ModelCatalog()
    catalog.update(0, WITH_ADAPTER)
    everything = catalog.listing(lambda model: True)
    assert [entry["id"] for entry in everything] == ["qwen", "team-a"]
    only = catalog.listing(lambda model: model == "team-a")
    assert only == [{"id": "team-a", "parent": "qwen"}]


def test_learned_models_are_bounded() -> None:
    catalog = ModelCatalog()
    for index in range(ModelCatalog.MAX_LEARNED + 10):
        catalog.learn(f"m{index}")
    assert catalog.label("m0") == "m0"
    assert catalog.label(f"m{ModelCatalog.MAX_LEARNED}") == OTHER_MODEL
    assert catalog.context_window("m0") is None
