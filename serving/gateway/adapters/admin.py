"""The admin API's adapter routes: list, load and unload LoRA adapters on every engine
(docs/adapters.md, runtime adapters).

    GET    /admin/v1/adapters           what the registry holds, and where each one is loaded
    POST   /admin/v1/adapters           {"name": "team-a-lora", "path": "/adapters/team-a"}
    DELETE /admin/v1/adapters/NAME      unload everywhere (kept as removed, see `registry`)

Rules:
- off (403 naming the setting) unless the gateway runs with `--runtime-adapters`;
- a load answers once every engine in the rotation was asked: 200 with the engines that hold
  it, or 400 with their reasons when none could (then it is kept as removed);
- the engines' own adapters (a profile's `lora` section) are not this API's: a load or unload
  of a name an engine lists and the registry never held answers 409 (`param` "name"), so a
  load waits (503) until one engine's list was read, unless no engine is known at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable
from typing import TypeVar

from serving.gateway.adapters.registry import AdapterEntry, AdapterStoreUnavailable
from serving.gateway.adapters.sync import AdapterSync
from serving.gateway.admin.api import AdminApi, AdminRequest
from serving.gateway.catalog import ModelCatalog
from serving.gateway.errors import (
    EndpointNotAllowedError,
    GatewayError,
    InvalidRequestError,
    RouteNotFoundError,
    UpstreamUnavailableError,
)
from serving.gateway.routing.router import Router

PATH = "/admin/v1/adapters"
# vLLM takes any string; these names also stay safe in URLs, logs and metric labels.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_PATH = 4096
T = TypeVar("T")


class AdapterStoreError(GatewayError):
    status = 503
    type = "server_error"
    code = "adapter_store_unavailable"


class EnginesOwnAdapterError(GatewayError):
    """The name of an adapter the engines were started with, not loaded through this API."""

    status = 409
    type = "invalid_request_error"
    code = "engine_adapter"


class AdapterRoutes:
    def __init__(
        self,
        sync: AdapterSync | None,
        router: Router,
        catalog: ModelCatalog,
        *,
        retry_after_s: float,
    ) -> None:
        self._sync = sync
        self._router = router
        self._catalog = catalog
        self._retry_after_s = retry_after_s

    def register(self, admin: AdminApi) -> None:
        admin.add("GET", PATH, self.list)
        admin.add("POST", PATH, self.load)
        admin.add("DELETE", PATH + "/", self.unload, prefix=True)

    def _on(self) -> AdapterSync:
        if self._sync is None:
            raise EndpointNotAllowedError(
                "Runtime adapters are off: start the gateway with --runtime-adapters (and the "
                "engines with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)."
            )
        return self._sync

    async def list(self, request: AdminRequest) -> tuple[int, object]:
        sync = self._on()
        entries = await _guarded(sync.run())
        return 200, {"object": "list", "data": [self._describe(entry) for entry in entries]}

    async def load(self, request: AdminRequest) -> tuple[int, object]:
        sync = self._on()
        name, path = _load_body(request.body)
        if self._catalog.is_base(name):
            raise InvalidRequestError(f"{name!r} is a base model the engines serve.", param="name")
        if self._router.engines and not self._catalog.known:
            raise UpstreamUnavailableError(
                "No engine's model list has been read yet, so the adapters the engines were "
                "started with are not known; retry later.",
                retry_after_s=self._retry_after_s,
            )
        await self._refuse_engines_own(sync, name)
        entry = await _guarded(sync.registry.put(name, path))
        await _guarded(sync.run())
        described = self._describe(entry)
        if self._router.engines and not described["engines"]:
            await _guarded(sync.registry.remove(name))
            reasons = "; ".join(
                f"{engine}: {why}" for (engine, adapter), why in sync.problems.items()
                if adapter == name
            )  # fmt: skip
            await _guarded(sync.run())  # unload wherever a partial load left it
            raise InvalidRequestError(
                f"No engine could load adapter {name!r} ({reasons or 'no engine answered'}); "
                "it is loaded nowhere.",
                param="path",
            )
        return 200, described

    async def unload(self, request: AdminRequest) -> tuple[int, object]:
        sync = self._on()
        name = request.tail
        entry = await _guarded(sync.registry.remove(name))
        if entry is None:
            await self._refuse_engines_own(sync, name)
            raise RouteNotFoundError(f"No adapter {name!r} was loaded through this API.")
        await _guarded(sync.run())
        return 200, self._describe(entry)

    async def _refuse_engines_own(self, sync: AdapterSync, name: str) -> None:
        """409 when `name` is one of the engines' own adapters: some engine lists it as an
        adapter, and the registry never held it (loaded or removed), so no engine got it from
        this API."""
        serving = self._catalog.engines_serving(name)
        if serving is None or self._catalog.base_model(name) is None:
            return
        entries = await _guarded(sync.registry.entries())
        if any(entry.name == name for entry in entries):
            return
        holding = sorted(engine.label for engine in self._router.engines if engine.index in serving)
        raise EnginesOwnAdapterError(
            f"{name!r} is an adapter the engines were started with (their profile's lora "
            f"section; listed by {', '.join(holding) or 'an engine'}): it is not loaded or "
            "unloaded at run time. Change the profile, or name the runtime adapter otherwise.",
            param="name",
        )

    def _describe(self, entry: AdapterEntry) -> dict[str, object]:
        holding = sorted(
            engine.label
            for engine in self._router.engines
            if entry.name in (self._catalog.models_of(engine.index) or {})
        )
        problems = {}
        if self._sync is not None:
            problems = {
                engine: why
                for (engine, adapter), why in self._sync.problems.items()
                if adapter == entry.name
            }
        return {
            "name": entry.name,
            "path": entry.path,
            "state": "loaded" if entry.loaded else "removed",
            "updated_at": entry.updated_at,
            "engines": holding,
            "problems": problems,
        }


async def _guarded(pending: Awaitable[T]) -> T:
    """A registry call or a sync round, its store failures answered as 503."""
    try:
        return await pending
    except AdapterStoreUnavailable as exc:
        raise AdapterStoreError(str(exc)) from None


def _load_body(body: bytes) -> tuple[str, str]:
    try:
        data = json.loads(body or b"null")
    except ValueError:
        raise InvalidRequestError('The body must be JSON: {"name": ..., "path": ...}.') from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The body must be a JSON object with name and path.")
    unknown = sorted(set(data) - {"name", "path"})
    if unknown:
        raise InvalidRequestError(f"Unknown field {unknown[0]!r}.", param=unknown[0])
    name, path = data.get("name"), data.get("path")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidRequestError(
            "name must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit.",
            param="name",
        )
    if not isinstance(path, str) or not path.strip() or len(path) > MAX_PATH:
        raise InvalidRequestError(
            "path must be the adapter's directory on the engines' filesystem.", param="path"
        )
    return name, path
