"""The models the engines serve: which engine serves which model or LoRA adapter, and windows.

    catalog = ModelCatalog()
    catalog.update(engine.index, await upstream.fetch_models())   # by the health monitor
    catalog.context_window("qwen3-tiny")      # vLLM's max_model_len (an adapter: its base's)
    catalog.label(model)                      # bounded `model` metric label
    catalog.engines_serving("team-a-lora")    # ids of the engines that list it, or None
    catalog.base_model("team-a-lora")         # vLLM's `parent`: "qwen3-tiny"
    catalog.listing(caller.allows_model)      # /v1/models for one key

Rules:
- each engine's `/v1/models` is kept apart (a runtime adapter need not be on every engine):
  a model goes to the engines that list it, one no engine lists to any engine (vLLM's 404);
- the context window caps an implied max_tokens; `label` keeps the `model` metric label
  bounded against clients sending arbitrary names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

OTHER_MODEL = "other"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    window: int | None
    """vLLM's max_model_len (None for an adapter: its base model's applies)."""
    parent: str | None
    """An adapter's base model (vLLM's `parent`); None for a base model."""
    entry: Mapping[str, object]
    """The engine's own `/v1/models` entry, served to clients as it is."""


class ModelCatalog:
    # Models learned from successful responses (not listed by the upstream) are kept up to
    # this many, so labels stay bounded.
    MAX_LEARNED = 64

    def __init__(self) -> None:
        self._by_engine: dict[int, dict[str, ModelInfo]] = {}
        self._models: dict[str, ModelInfo] = {}
        self._serving: dict[str, frozenset[int]] = {}
        self._learned: set[str] = set()

    def update(self, engine: int, models: Mapping[str, ModelInfo]) -> None:
        """What engine `engine` lists now (its `/v1/models`)."""
        self._by_engine[engine] = dict(models)
        self._rebuild()

    def retain(self, engines: Iterable[int]) -> None:
        """Forget the engines not in `engines` (drained: no longer discovered)."""
        keep = set(engines)
        if set(self._by_engine) - keep:
            self._by_engine = {i: models for i, models in self._by_engine.items() if i in keep}
            self._rebuild()

    def models_of(self, engine: int) -> Mapping[str, ModelInfo] | None:
        """What `engine` listed last; None before its list was read."""
        return self._by_engine.get(engine)

    def _rebuild(self) -> None:
        models: dict[str, ModelInfo] = {}
        serving: dict[str, set[int]] = {}
        for engine in sorted(self._by_engine):
            for name, info in self._by_engine[engine].items():
                models.setdefault(name, info)
                serving.setdefault(name, set()).add(engine)
        self._models = models
        self._serving = {name: frozenset(ids) for name, ids in serving.items()}

    def context_window(self, model: str) -> int | None:
        info = self._models.get(model)
        if info is None:
            return None
        if info.window is None and info.parent is not None:
            base = self._models.get(info.parent)
            return base.window if base is not None else None
        return info.window

    def base_model(self, model: str) -> str | None:
        """The base model of adapter `model`; None for a base model or an unknown name."""
        info = self._models.get(model)
        return info.parent if info is not None else None

    def is_base(self, model: str) -> bool:
        """Whether some engine lists `model` as a base model (not an adapter)."""
        info = self._models.get(model)
        return info is not None and info.parent is None

    def engines_serving(self, model: str) -> frozenset[int] | None:
        """The engines that list `model`; None when none does (any engine may answer)."""
        return self._serving.get(model)

    def listing(self, allows: Callable[[str], bool]) -> list[Mapping[str, object]]:
        """The `/v1/models` entries of the models `allows` lets through, in name order."""
        return [info.entry for name, info in sorted(self._models.items()) if allows(name)]

    @property
    def known(self) -> bool:
        """Whether some engine's list has been read."""
        return bool(self._by_engine)

    def label(self, model: str) -> str:
        """`model` if an engine is known to serve it, else `other`."""
        if model in self._models or model in self._learned:
            return model
        return OTHER_MODEL

    def learn(self, model: str) -> None:
        """The upstream answered 2xx for `model`: it is real."""
        if model not in self._models and len(self._learned) < self.MAX_LEARNED:
            self._learned.add(model)
