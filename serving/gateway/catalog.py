"""The models the upstream serves, with their context windows.

    catalog = ModelCatalog()
    catalog.update(await upstream.fetch_models())   # by the health monitor
    catalog.context_window("qwen3-tiny")            # vLLM's max_model_len, or None
    catalog.label(model)                            # bounded `model` metric label

The context window caps an implied max_tokens; the label keeps the `model` metric label
bounded, since a client could otherwise fill it with arbitrary names.
"""

from __future__ import annotations

OTHER_MODEL = "other"


class ModelCatalog:
    # Models learned from successful responses (not listed by the upstream, e.g. LoRA
    # adapters loaded later) are kept up to this many, so labels stay bounded.
    MAX_LEARNED = 64

    def __init__(self) -> None:
        self._windows: dict[str, int | None] = {}
        self._learned: set[str] = set()

    def update(self, models: dict[str, int | None]) -> None:
        self._windows = models

    def context_window(self, model: str) -> int | None:
        return self._windows.get(model)

    def label(self, model: str) -> str:
        """`model` if the upstream is known to serve it, else `other`."""
        if model in self._windows or model in self._learned:
            return model
        return OTHER_MODEL

    def learn(self, model: str) -> None:
        """The upstream answered 2xx for `model`: it is real."""
        if model not in self._windows and len(self._learned) < self.MAX_LEARNED:
            self._learned.add(model)
