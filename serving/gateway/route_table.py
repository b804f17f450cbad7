"""Every path the gateway answers, and how each is metered: one table for every key
(docs/gateway.md, routes).

    route = ROUTES.lookup("POST", "/v1/responses/", opt_in=settings.opt_in_routes)
    route.metering        # "chat" | "completion" | "responses" | "messages" | "embeddings" | ...
    route.path            # vLLM's spelling, where the request is sent
    dialect_of(path)      # how errors and rate-limit headers are worded on that path

Rules:
- a path is served only when its cost is known (the gateway's view must bound what vLLM
  does): metered routes reserve first, `free` ones cost no generation;
- everything else is refused before it reaches vLLM, the same for every key: a route vLLM
  serves but the gateway does not (`REFUSED`) 403 `endpoint_not_allowed`, any other 404;
- a path with one trailing slash added is served as the canonical one (vLLM redirects);
- only `UPSTREAM_HEADERS` reach vLLM: some of its own headers would let a client change how
  the engine treats its request;
- Anthropic's paths (`/v1/messages` and below, refused ones too) answer in Anthropic's words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from serving.gateway.anthropic_errors import ANTHROPIC
from serving.gateway.api_dialect import OPENAI, Dialect
from serving.gateway.errors import EndpointNotAllowedError, GatewayError, RouteNotFoundError
from serving.gateway.request_fields import Kind

Metering = Literal[
    "chat", "completion", "responses", "messages", "embeddings", "score", "rerank", "free",
    "models", "health", "batches",
]  # fmt: skip
OptIn = Literal["tokenize"]
HEALTH_PATH = "/health"
TOKENIZE_PATH = "/tokenize"
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
_MESSAGES_PREFIX = MESSAGES_PATH + "/"
FILES_PATH = "/v1/files"
BATCHES_PATH = "/v1/batches"


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    """vLLM's spelling of the path."""
    methods: tuple[str, ...]
    metering: Metering
    opt_in: OptIn | None = None
    """The `--serve-routes` name an operator must list for this route to be served."""

    @property
    def metered(self) -> Kind | None:
        """The kind of body the route reserves for; None for a free route."""
        metering = self.metering
        if (
            metering == "free"
            or metering == "models"
            or metering == "health"
            or metering == "batches"
        ):
            return None
        return metering


_TABLE: tuple[Route, ...] = (
    Route("/v1/chat/completions", ("POST",), "chat"),
    Route("/v1/completions", ("POST",), "completion"),
    Route("/v1/responses", ("POST",), "responses"),
    Route(MESSAGES_PATH, ("POST",), "messages"),
    # Pooling models: prompt tokens reserved and settled, nothing generated. vLLM's other
    # spellings of the same APIs (/score, /rerank) stay refused: one path per API.
    Route("/v1/embeddings", ("POST",), "embeddings"),
    Route("/v1/score", ("POST",), "score"),
    Route("/v1/rerank", ("POST",), "rerank"),
    Route("/v2/rerank", ("POST",), "rerank"),
    # Free: a tokenization, its body checked like a Messages body (fields, media).
    Route(COUNT_TOKENS_PATH, ("POST",), "free"),
    # Answered by the gateway from every engine's list, filtered to what the key may use.
    Route("/v1/models", ("GET",), "models"),
    Route(HEALTH_PATH, ("GET", "HEAD"), "health"),
    # Answered by the gateway (`batches`): each key's files and batches, and the paths below
    # them (`/v1/files/{id}/content`, `/v1/batches/{id}/cancel`); the lines run metered.
    Route(FILES_PATH, ("GET", "POST", "DELETE"), "batches"),
    Route(BATCHES_PATH, ("GET", "POST"), "batches"),
    # Free: no generation, and the chat form is checked like a chat body (media, fields).
    Route(TOKENIZE_PATH, ("POST",), "free", opt_in="tokenize"),
    Route("/detokenize", ("POST",), "free", opt_in="tokenize"),
)

# vLLM 0.32's own routes that the gateway refuses, and why (the 403 says so).
_NOT_METERED = "its tokens would not be charged to your key"
_ENGINE_ADMIN = "it is the engine's own, for its operators"
_SERVED_ELSEWHERE = "send it to the same API under /v1 (/v1/score, /v1/rerank)"
REFUSED: dict[str, str] = {
    "/v1/messages/render": _NOT_METERED,
    "/v1/chat/completions/batch": _NOT_METERED,
    "/v1/chat/completions/render": _NOT_METERED,
    "/v1/chat/completions/derender": _NOT_METERED,
    "/v1/completions/render": _NOT_METERED,
    "/v1/completions/derender": _NOT_METERED,
    "/v2/embed": _NOT_METERED,
    "/v1/audio/transcriptions": _NOT_METERED,
    "/v1/audio/translations": _NOT_METERED,
    "/v1/systemone": _NOT_METERED,
    "/pooling": _NOT_METERED,
    "/classify": _NOT_METERED,
    "/score": _SERVED_ELSEWHERE,
    "/rerank": _SERVED_ELSEWHERE,
    "/generative_scoring": _NOT_METERED,
    "/cohere/v2/chat": _NOT_METERED,
    "/cohere/v2/chat/render": _NOT_METERED,
    "/invocations": _NOT_METERED,
    "/inference/v1/generate": _NOT_METERED,
    "/tokenizer_info": _NOT_METERED,
    "/v1/load_lora_adapter": _ENGINE_ADMIN,
    "/v1/unload_lora_adapter": _ENGINE_ADMIN,
    "/reset_prefix_cache": _ENGINE_ADMIN,
    "/reset_mm_cache": _ENGINE_ADMIN,
    "/reset_encoder_cache": _ENGINE_ADMIN,
    "/release_kv_cache_memory": _ENGINE_ADMIN,
    "/sleep": _ENGINE_ADMIN,
    "/wake_up": _ENGINE_ADMIN,
    "/is_sleeping": _ENGINE_ADMIN,
    "/collective_rpc": _ENGINE_ADMIN,
    "/scale_elastic_ep": _ENGINE_ADMIN,
    "/is_scaling_elastic_ep": _ENGINE_ADMIN,
    "/start_profile": _ENGINE_ADMIN,
    "/stop_profile": _ENGINE_ADMIN,
    "/fault_tolerance/apply": _ENGINE_ADMIN,
    "/fault_tolerance/status": _ENGINE_ADMIN,
    "/abort_requests": _ENGINE_ADMIN,
    "/inference/v1/abort_requests": _ENGINE_ADMIN,
    "/pause": _ENGINE_ADMIN,
    "/resume": _ENGINE_ADMIN,
    "/is_paused": _ENGINE_ADMIN,
    "/get_world_size": _ENGINE_ADMIN,
    "/weight_info": _ENGINE_ADMIN,
    "/init_weight_transfer_engine": _ENGINE_ADMIN,
    "/shutdown_weight_transfer_engine": _ENGINE_ADMIN,
    "/start_weight_update": _ENGINE_ADMIN,
    "/start_draft_weight_update": _ENGINE_ADMIN,
    "/update_weights": _ENGINE_ADMIN,
    "/finish_weight_update": _ENGINE_ADMIN,
    "/update_weight_version": _ENGINE_ADMIN,
    "/weight_checker": _ENGINE_ADMIN,
    "/server_info": _ENGINE_ADMIN,
    "/load": _ENGINE_ADMIN,
    "/version": _ENGINE_ADMIN,
    "/kv_event_sources": _ENGINE_ADMIN,
    "/ping": _ENGINE_ADMIN,
}
# Responses stored by vLLM (GET/DELETE /v1/responses/{id}, .../cancel) are refused as a
# family: they would reach another key's stored responses by id.
_REFUSED_PREFIXES: dict[str, str] = {
    "/v1/responses/": "stored responses are not kept for your key",
}

# Request headers that reach vLLM. Everything else stays at the gateway: credentials, hop-by-
# hop headers, and vLLM's own control headers. The hop client sets host and content-length.
UPSTREAM_HEADERS: frozenset[bytes] = frozenset(
    {b"content-type", b"accept", b"user-agent", b"traceparent", b"tracestate"}
)


class RouteTable:
    def __init__(self, routes: tuple[Route, ...]) -> None:
        self._routes = {route.path: route for route in routes}

    def lookup(self, method: str, path: str, *, opt_in: frozenset[str] = frozenset()) -> Route:
        """The route `method path` is served by, or the `GatewayError` that refuses it."""
        route = self._routes.get(path)
        if route is None and path.endswith("/"):
            route = self._routes.get(path[:-1])
        if route is None:
            family = self._routes.get("/".join(path.split("/", 3)[:3]))
            if family is not None and family.metering == "batches":
                return family  # the Batch API checks the methods of the paths below it
        if route is not None and (route.opt_in is None or route.opt_in in opt_in):
            if method in route.methods:
                return route
            raise wrong_method(method, path, route.methods[0])
        raise refusal(method, path)

    def routes(self) -> list[Route]:
        return sorted(self._routes.values(), key=lambda route: route.path)

    def with_routes(self, *routes: Route) -> RouteTable:
        """This table and `routes` (tests: a fake upstream's own paths)."""
        return RouteTable((*self._routes.values(), *routes))


ROUTES = RouteTable(_TABLE)


def dialect_of(path: str) -> Dialect:
    """The words of the API `path` belongs to: Anthropic's under `/v1/messages`, else OpenAI's."""
    if path == MESSAGES_PATH or path.startswith(_MESSAGES_PREFIX):
        return ANTHROPIC
    return OPENAI


def refusal(method: str, path: str) -> GatewayError:
    """The error for a path the gateway does not serve (403 for vLLM's, else 404)."""
    canonical = path[:-1] if path.endswith("/") and len(path) > 1 else path
    why = REFUSED.get(canonical)
    if why is None:
        why = next(
            (text for prefix, text in _REFUSED_PREFIXES.items() if canonical.startswith(prefix)),
            None,
        )
    if why is not None:
        return _not_allowed(method, path, why)
    return RouteNotFoundError(f"Invalid URL ({method} {path})")


def wrong_method(method: str, path: str, allowed: str = "GET") -> GatewayError:
    return _not_allowed(method, path, f"it answers {allowed} only")


def _not_allowed(method: str, path: str, why: str) -> EndpointNotAllowedError:
    return EndpointNotAllowedError(f"{method} {path} is not served by this gateway: {why}.")
