"""The playground's files over HTTP: exact names only, strict headers, revalidated caching
(docs/playground.md).

    playground = Playground.load()      # reads static/ once, when the app is built
    playground.handles("/playground/playground.js")  # True: the app routes it here
    await playground.serve(scope, send, request_id=rid)

Rules:
- `/playground` (and `/playground/`) is the page; `/playground/NAME` is the file NAME of
  `static/` as `load` read it: nothing touches the file system per request, so no path can
  reach another file; anything else, and methods other than GET and HEAD, is the gateway's
  usual 404;
- no key: the page holds no secret; the API calls it makes carry the user's key;
- `Cache-Control: no-cache` with an `ETag`, so a page and script of different versions never
  meet; a Content-Security-Policy of this origin only (images also from `data:`), no inline
  script or style, no framing, no referrer.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

from serving.gateway.errors import RouteNotFoundError
from serving.gateway.forwarded_headers import REQUEST_ID
from serving.gateway.responses import send_error
from serving.gateway.types import RawHeaders, Scope, Send

PLAYGROUND_PATH = "/playground"
INDEX = "index.html"

CONTENT_TYPES: dict[str, bytes] = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".png": b"image/png",
    ".svg": b"image/svg+xml",
}

CONTENT_SECURITY_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    b"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

SECURITY_HEADERS: RawHeaders = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),  # for browsers that ignore frame-ancestors
    (b"cross-origin-opener-policy", b"same-origin"),
]


@dataclass(frozen=True, slots=True)
class Asset:
    """One file as served: its bytes, content type and entity tag."""

    body: bytes
    content_type: bytes
    etag: bytes

    @classmethod
    def of(cls, name: str, body: bytes) -> Asset:
        suffix = name[name.rfind(".") :] if "." in name else ""
        content_type = CONTENT_TYPES.get(suffix)
        if content_type is None:  # a file shipped without a known type would be sniffed
            raise ValueError(f"playground file {name!r}: no content type for {suffix!r}")
        digest = hashlib.sha256(body).hexdigest()[:32]
        return cls(body, content_type, b'"' + digest.encode() + b'"')


class Playground:
    def __init__(self, assets: dict[str, Asset]) -> None:
        if INDEX not in assets:
            raise ValueError(f"playground files lack {INDEX}")
        self._assets = assets

    @classmethod
    def load(cls, directory: Traversable | None = None) -> Playground:
        """The files of `directory` (default: the package's `static/`), read once."""
        root = directory or resources.files(__package__ or "serving.gateway.playground") / "static"
        assets = {
            entry.name: Asset.of(entry.name, entry.read_bytes())
            for entry in root.iterdir()
            if entry.is_file() and not entry.name.startswith(".")
        }
        return cls(assets)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._assets)

    @staticmethod
    def handles(path: str) -> bool:
        """Whether `path` is the playground's to answer (404s under it included)."""
        return path == PLAYGROUND_PATH or path.startswith(PLAYGROUND_PATH + "/")

    def find(self, path: str) -> Asset | None:
        name = path[len(PLAYGROUND_PATH) :].removeprefix("/") or INDEX
        return self._assets.get(name)

    async def serve(self, scope: Scope, send: Send, *, request_id: bytes) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        asset = self.find(path) if method in ("GET", "HEAD") else None
        if asset is None:
            error = RouteNotFoundError(f"Invalid URL ({method} {path})")
            await send_error(send, error, request_id=request_id)
            return
        headers: RawHeaders = [
            (b"content-type", asset.content_type),
            (b"cache-control", b"no-cache"),
            (b"etag", asset.etag),
            (REQUEST_ID, request_id),
            *SECURITY_HEADERS,
        ]
        if _matches(_header(scope, b"if-none-match"), asset.etag):
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        headers.append((b"content-length", str(len(asset.body)).encode()))
        body = asset.body if method == "GET" else b""
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _matches(if_none_match: bytes | None, etag: bytes) -> bool:
    """RFC 9110 13.1.2: `*` or any listed tag, compared weakly (a `W/` prefix is ignored)."""
    if if_none_match is None:
        return False
    tags = [tag.strip().removeprefix(b"W/") for tag in if_none_match.split(b",")]
    return b"*" in tags or etag in tags
