"""The playground's files as the gateway serves them: no key, exact types, strict headers,
404s for anything but its own files, and the pages' rules the CSP relies on."""

from __future__ import annotations

import fnmatch
import http.client
import json
import logging
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path

import pytest

from serving.gateway.playground import Playground
from serving.gateway.playground.assets import CONTENT_SECURITY_POLICY, Asset
from tests.gateway.conftest import GatewayFactory
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]
STATIC = resources.files("serving.gateway.playground") / "static"
TYPES = {
    "/playground": "text/html; charset=utf-8",
    "/playground/": "text/html; charset=utf-8",
    "/playground/index.html": "text/html; charset=utf-8",
    "/playground/playground.js": "text/javascript; charset=utf-8",
    "/playground/api.js": "text/javascript; charset=utf-8",
    "/playground/playground.css": "text/css; charset=utf-8",
}


def raw_get(gateway: GatewayServer, path: str, method: str = "GET") -> http.client.HTTPResponse:
    """`path` sent byte for byte (httpx and browsers would normalise `..` away first)."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    connection.putrequest(method, path, skip_accept_encoding=True)
    connection.endheaders()
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


@pytest.mark.parametrize("path", sorted(TYPES))
def test_files_are_served_without_a_key_with_their_type_and_strict_headers(
    gateway: GatewayServer, path: str
) -> None:
    with http_client(gateway.url, key=None) as http:
        response = http.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == TYPES[path]
    name = path.removeprefix("/playground").strip("/") or "index.html"
    assert response.content == (STATIC / name).read_bytes()
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY.decode()
    assert "connect-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["etag"].startswith('"')
    assert "x-request-id" in response.headers


def test_revalidation_answers_304_and_head_has_no_body(gateway: GatewayServer) -> None:
    with http_client(gateway.url, key=None) as http:
        first = http.get("/playground/playground.js")
        etag = first.headers["etag"]
        for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            again = http.get("/playground/playground.js", headers={"If-None-Match": header})
            assert again.status_code == 304 and again.content == b""
            assert again.headers["etag"] == etag
        changed = http.get("/playground/playground.js", headers={"If-None-Match": '"old"'})
        assert changed.status_code == 200 and changed.content == first.content
        head = http.head("/playground")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == str(len((STATIC / "index.html").read_bytes()))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/playground/missing.js"),
        ("GET", "/playground/static/playground.js"),
        ("GET", "/playground/index.html/"),
        ("GET", "/playground/PLAYGROUND.JS"),
        ("GET", "/playgroundx"),
        ("POST", "/playground"),
        ("DELETE", "/playground/playground.js"),
    ],
)
def test_anything_else_is_an_openai_404(gateway: GatewayServer, method: str, path: str) -> None:
    with http_client(gateway.url, key=None) as http:
        response = http.request(method, path)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_url"


@pytest.mark.parametrize(
    "path",
    [
        "/playground/../app.py",
        "/playground/../../serving/gateway/app.py",
        "/playground/%2e%2e/app.py",
        "/playground/..%2fassets.py",
        "/playground/%2e%2e%2f%2e%2e%2fpyproject.toml",
        "/playground/..\\assets.py",
        "/playground//etc/passwd",
        "/playground/%2fetc%2fpasswd",
        "/playground/assets.py",
        "/playground/__init__.py",
        "/playground/static/index.html",
        "/playground/./playground.js",
    ],
)
def test_no_path_reaches_another_file(gateway: GatewayServer, path: str) -> None:
    response = raw_get(gateway, path)
    assert response.status == 404
    assert response.getheader("content-type") == "application/json"


def test_the_page_has_no_inline_code_so_the_csp_allows_all_of_it() -> None:
    """What `script-src 'self'; style-src 'self'` needs: scripts and styles only from files
    the playground serves, no inline ones, no event-handler attributes."""

    class Scan(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.sources: list[str] = []
            self.problems: list[str] = []
            self._tag = ""

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self._tag = tag
            values = dict(attrs)
            self.problems += [f"{tag} {name}" for name in values if name.startswith("on")]
            if "style" in values or tag == "style":
                self.problems.append(f"inline style on {tag}")
            if tag == "script":
                self.sources.append(values.get("src") or "")
            if tag == "link" and values.get("rel") == "stylesheet":
                self.sources.append(values.get("href") or "")
            if tag == "form":
                self.problems.append("a form could submit a key into a URL")

        def handle_data(self, data: str) -> None:
            if self._tag == "script" and data.strip():
                self.problems.append("inline script")

    scan = Scan()
    scan.feed((STATIC / "index.html").read_text())
    assert not scan.problems
    names = Playground.load().names
    assert scan.sources and all(
        source.startswith("/playground/") and source.removeprefix("/playground/") in names
        for source in scan.sources
    ), scan.sources
    for name in ("playground.js", "api.js"):
        script = (STATIC / name).read_text()
        # Model output and API messages are text: set as textContent, never parsed as HTML.
        for construct in ("innerHTML", "outerHTML", "insertAdjacentHTML", "eval(", "Function("):
            assert construct not in script, (name, construct)
        # The key goes into the Authorization header only: never a URL, never the console.
        assert "console." not in script and "?key=" not in script, name


def test_every_file_is_package_data_with_a_known_type() -> None:
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["serving"]
    files = [entry.name for entry in STATIC.iterdir() if entry.is_file()]
    assert {"index.html", "playground.js", "api.js", "playground.css"} <= set(files)
    for name in files:
        shipped = f"gateway/playground/static/{name}"
        assert any(fnmatch.fnmatch(shipped, pattern) for pattern in package_data), shipped
    assert Playground.load().names == set(files)


def test_a_file_without_a_known_type_or_a_missing_index_fails_at_load(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no content type for '\.py'"):
        Asset.of("assets.py", b"")
    (tmp_path / "playground.js").write_text("")
    with pytest.raises(ValueError, match=r"lack index\.html"):
        Playground.load(tmp_path)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def captured_logs() -> Iterator[list[str]]:
    """Every line the gateway and uvicorn (its access log too) log meanwhile. Entered after
    the server is built: building it applies uvicorn's logging config, which would drop the
    handler, and its level (warning in tests), which would drop the access lines."""
    handler = _Lines()
    loggers = [logging.getLogger(name) for name in ("serving", "uvicorn", "uvicorn.access")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def test_the_access_log_shows_the_page_and_api_calls_but_never_the_key(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway(access_log=True)
    with captured_logs() as lines:
        with http_client(gateway.url, key=None) as http:
            assert http.get("/playground").status_code == 200
        # The calls the page's script makes, with the same headers.
        with http_client(gateway.url, key=TEST_KEY) as http:
            assert http.get("/v1/models").status_code == 200
            body = {
                "model": "fake",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": 3,
            }
            with http.stream("POST", "/v1/chat/completions", content=json.dumps(body)) as stream:
                assert stream.status_code == 200
                assert b"[DONE]" in b"".join(stream.iter_bytes())
            assert (
                http.get("/v1/models", headers={"Authorization": "Bearer sk-wrong"}).status_code
                == 401
            )
    joined = "\n".join(lines)
    assert '"GET /playground HTTP/1.1" 200' in joined, joined
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in joined, joined
    assert TEST_KEY not in joined and "sk-wrong" not in joined
