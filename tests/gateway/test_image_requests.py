"""Chat requests with images through the gateway, over real sockets, to the fake upstream.

An image reserves its token count from its pixel size (what vLLM counts), not its base64
length; every refused image is a 400 naming the field, before anything is reserved,
forwarded or charged.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from typing import Any

import httpx
import pytest
from PIL import Image

from serving.gateway.images import IMAGE_PART_TOKENS, ImagePolicy
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.openai_request import BASE_TOKENS, PER_MESSAGE_TOKENS
from serving.gateway.quota import Limits
from serving.gateway.settings import GatewaySettings
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import key_usage, settled
from tests.gateway.servers import GatewayServer, http_client

pytestmark = pytest.mark.timeout(60)

TEXT = {"type": "text", "text": "What is in this picture?"}


def png_url(width: int, height: int, *, noise: bool = False) -> str:
    image = Image.effect_noise((width, height), 80).convert("RGB") if noise else \
        Image.new("RGB", (width, height), (20, 120, 220))  # fmt: skip
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def padded_png_url(width: int, height: int, padding: int) -> str:
    """A valid PNG header with `padding` bytes of an ancillary chunk before its data: a
    large file cheaply (its tokens are its pixels')."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload).to_bytes(4, "big")
        return len(payload).to_bytes(4, "big") + kind + payload + crc

    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    data = b"\x89PNG\r\n\x1a\n" + ihdr + chunk(b"zzZz", b"\x00" * padding)
    return "data:image/png;base64," + base64.b64encode(data + chunk(b"IEND", b"")).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}


def chat(*contents: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content} for content in contents]
    return {"model": "fake", "messages": messages, "max_tokens": 10, **fields}


def post(gateway: GatewayServer, secret: str, payload: Any, token: str) -> httpx.Response:
    with http_client(gateway.url, key=secret, timeout=30) as http:
        return http.post(f"/v1/chat/completions?t={token}", json=payload)


@pytest.fixture
def keyed(make_gateway: GatewayFactory, keys: SqliteKeyStore) -> GatewayServer:
    return make_gateway(keys_db=str(keys.path), max_images_per_request=3)


def test_an_image_reserves_its_token_count_not_its_base64_length(
    keyed: GatewayServer, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    url = png_url(1024, 768, noise=True)
    assert len(url) > 2_000_000  # millions of "tokens" if its text were counted
    _, secret = keys.create(KeySpec("vision", limits=Limits(tpm=5_000)))
    response = post(keyed, secret, chat([TEXT, image_part(url)]), token)
    assert response.status_code == 200, response.text
    # Written out independently: the message's role and text part as UTF-8 bytes, the
    # image's 37 x 27 tokens (1024x768 resizes to 1036x756) and the template around it.
    text_bytes = len("user") + len(json.dumps(TEXT))
    estimate = BASE_TOKENS + PER_MESSAGE_TOKENS + text_bytes + 37 * 27 + IMAGE_PART_TOKENS
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == 5_000 - estimate - 10
    [sent] = upstream.received(token)
    assert sent["messages"][0]["content"][1]["image_url"]["url"] == url  # passed on as sent
    assert settled(keyed)


def reserved(gateway: GatewayServer, keys: SqliteKeyStore, payload: Any, token: str) -> int:
    """Tokens reserved for `payload`, read off the rate-limit headers of a fresh key."""
    _, secret = keys.create(KeySpec("vision", limits=Limits(tpm=100_000)))
    response = post(gateway, secret, payload, token)
    assert response.status_code == 200, response.text
    return 100_000 - int(response.headers["x-ratelimit-remaining-tokens"])


def test_images_in_several_messages_add_up(
    keyed: GatewayServer, keys: SqliteKeyStore, token: str
) -> None:
    first = [image_part(png_url(28, 28))]
    second = [TEXT, image_part(png_url(56, 56)), image_part(png_url(9, 500))]
    policy = ImagePolicy.defaults()
    assert (policy.image_tokens(28, 28), policy.image_tokens(56, 56)) == (4, 4)  # min_pixels
    assert policy.image_tokens(9, 500) == 15  # upscaled to min_pixels: 28 x 420
    added = (PER_MESSAGE_TOKENS + len("user") + len(json.dumps(TEXT))
             + 4 + 15 + 2 * IMAGE_PART_TOKENS)  # fmt: skip
    one, both = (
        reserved(keyed, keys, chat(first), token),
        reserved(keyed, keys, chat(first, second), token),
    )
    assert both - one == added
    assert settled(keyed)


def test_a_body_of_several_large_images_fits_the_default_limit(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, upstream: FakeUpstream, token: str
) -> None:
    """Four 5 MB images (27 MB of base64) pass the default body limit and reserve what
    four 4000x3000 images cost (15,301 tokens each), not 27 million."""
    default = GatewaySettings.model_fields["max_body_bytes"].default
    gateway = make_gateway(keys_db=str(keys.path), max_body_bytes=default)
    url = padded_png_url(4000, 3000, 5_000_000)
    payload = chat([TEXT] + [image_part(url)] * 4)
    assert len(json.dumps(payload)) > 26_000_000
    tokens = reserved(gateway, keys, payload, token)
    image = ImagePolicy.defaults().image_tokens(4000, 3000)
    assert image == 107 * 143  # resized to 2996 x 4004, within max_pixels
    text = BASE_TOKENS + PER_MESSAGE_TOKENS + len("user") + len(json.dumps(TEXT))
    assert tokens == text + 4 * (image + IMAGE_PART_TOKENS) + 10
    assert len(upstream.received(token)) == 1
    assert settled(gateway)


# -- refused: 400 naming the field, nothing forwarded or charged ------------------------------


def bmp_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (30, 30)).save(buffer, "BMP")
    return "data:image/bmp;base64," + base64.b64encode(buffer.getvalue()).decode()


SMALL = png_url(64, 64)
TRUNCATED = "data:image/png;base64," + base64.b64encode(base64.b64decode(SMALL[22:])[:20]).decode()


@pytest.mark.parametrize(
    ("contents", "param", "words"),
    [
        ([[image_part(SMALL)] * 2, [TEXT, image_part(SMALL), image_part(SMALL)]],
         "messages[1].content[2]", "at most 3"),
        ([[TEXT, image_part("https://example.com/cat.png")]],
         "messages[0].content[1].image_url.url", "https: URLs are not fetched"),
        ([[image_part("http://169.254.169.254/latest/meta-data")]],
         "messages[0].content[0].image_url.url", "http: URLs are not fetched"),
        ([[image_part("file:///etc/passwd")]],
         "messages[0].content[0].image_url.url", "file: URLs are not fetched"),
        ([[{"type": "input_image", "image_url": "https://example.com/cat.png"}]],
         "messages[0].content[0].image_url", "not fetched"),
        ([[image_part(bmp_url())]], "messages[0].content[0].image_url.url", "PNG, JPEG, GIF"),
        ([[image_part("data:image/png;base64,%%%%not-base64")]],
         "messages[0].content[0].image_url.url", "not valid base64"),
        ([[image_part(TRUNCATED)]], "messages[0].content[0].image_url.url", "truncated"),
        ([[image_part(png_url(201, 1))]], "messages[0].content[0].image_url.url",
         "aspect ratio"),
        ([[{"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}]],
         "messages[0].content[0]", "'video_url' are not accepted"),
        ([[{"type": "image_url", "image_url": None, "uuid": "cached-image"}]],
         "messages[0].content[0].image_url", "sent earlier"),
    ],
)  # fmt: skip
def test_refused_images_are_400s_naming_the_field_and_cost_nothing(
    keyed: GatewayServer,
    keys: SqliteKeyStore,
    upstream: FakeUpstream,
    token: str,
    contents: list[list[dict[str, Any]]],
    param: str,
    words: str,
) -> None:
    record, secret = keys.create(KeySpec("vision", limits=Limits(rpm=10, tpm=100_000)))
    response = post(keyed, secret, chat(*contents), token)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert words in error["message"]
    assert response.headers["x-ratelimit-remaining-tokens"] == "100000"
    assert upstream.received(token) == []
    assert key_usage(keyed, record.key_id) == (0, 0, 0, 0)
    assert settled(keyed)


def test_a_gateway_for_a_text_model_refuses_images(
    make_gateway: GatewayFactory, upstream: FakeUpstream, token: str
) -> None:
    gateway = make_gateway(max_images_per_request=0)
    with http_client(gateway.url) as http:
        response = http.post(f"/v1/chat/completions?t={token}", json=chat([image_part(SMALL)]))
        text_only = http.post(f"/v1/chat/completions?t={token}", json=chat([TEXT]))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages[0].content[0]"
    assert "does not accept images" in error["message"]
    assert text_only.status_code == 200
    assert len(upstream.received(token)) == 1
