"""Image headers and the image token rule, held against Pillow and transformers themselves.

vLLM opens images with Pillow and counts an image's tokens with transformers' Qwen2-VL
`smart_resize`; the gateway reads the size from the header in pure Python. Every size here
is compared with what Pillow reports for the same bytes, and every token count with the
grid transformers' Qwen2-VL image processor produces (the PIL backend always; the
torchvision one too where torchvision imports), so the reservation is an upper bound of
vLLM's count: equal to it, plus the template's tokens around the image.
"""

from __future__ import annotations

import base64
import io
import struct
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil_processing

from serving.gateway.images import (
    Base64Reader,
    BytesReader,
    ImageError,
    ImageHeader,
    ImagePolicy,
    image_header,
    image_url_of,
    read_data_url,
)

DEFAULTS = ImagePolicy.defaults()
# Small bounds so the processor's downscaling and upscaling both run on small images.
SMALL = ImagePolicy(patch_size=14, merge_size=2, min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64,
                    max_images=8)  # fmt: skip
# (Pillow format, save options, the format the gateway names)
FORMATS: list[tuple[str, dict[str, Any], str]] = [
    ("PNG", {}, "png"),
    ("JPEG", {"quality": 85}, "jpeg"),
    ("JPEG", {"progressive": True, "exif": b"Exif\x00\x00" + b"\x00" * 60_000}, "jpeg"),
    ("GIF", {}, "gif"),
    ("WEBP", {"quality": 80}, "webp"),  # lossy: a "VP8 " chunk
    ("WEBP", {"lossless": True}, "webp"),  # "VP8L"
    ("WEBP", {"exif": b"Exif\x00\x00" + b"\x00" * 64}, "webp"),  # "VP8X"
]
SIZES = [(1, 1), (13, 2000), (2000, 13), (14, 14), (27, 28), (28, 28), (42, 70), (640, 480),
         (1023, 767), (3000, 2000), (200, 1), (1, 201), (4000, 20)]  # fmt: skip


def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def pillow_size(data: bytes) -> tuple[int, int]:
    with Image.open(io.BytesIO(data)) as image:
        return image.size


def processors(policy: ImagePolicy) -> list[Any]:
    """transformers' Qwen2-VL image processors that import here, configured as `policy`."""
    options = {"patch_size": policy.patch_size, "merge_size": policy.merge_size,
               "min_pixels": policy.min_pixels, "max_pixels": policy.max_pixels}  # fmt: skip
    found: list[Any] = [pil_processing.Qwen2VLImageProcessorPil(**options)]
    try:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
            Qwen2VLImageProcessor,
        )

        found.append(Qwen2VLImageProcessor(**options))
    except ImportError:  # torchvision is not installed: the PIL backend alone
        pass
    return found


def processor_tokens(processor: Any, image: Image.Image, merge_size: int) -> int:
    grid = processor(images=[image], return_tensors="np")["image_grid_thw"]
    t, h, w = (int(value) for value in grid[0])
    return t * h * w // (merge_size * merge_size)


# -- headers ------------------------------------------------------------------------------


@pytest.mark.parametrize(("fmt", "options", "name"), FORMATS)
@pytest.mark.parametrize("size", SIZES)
def test_header_size_is_what_pillow_reads(
    fmt: str, options: dict[str, Any], name: str, size: tuple[int, int]
) -> None:
    data = encode(Image.new("RGB", size, (200, 30, 90)), fmt, **options)
    header = read_data_url(data_url(data))
    assert header == ImageHeader(name, *pillow_size(data))
    assert (header.width, header.height) == size


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fmt=st.sampled_from(FORMATS),
    width=st.integers(1, 1500),
    height=st.integers(1, 1500),
    noise=st.booleans(),
)
def test_any_size_in_any_format_reads_as_pillow_reads_it(
    fmt: tuple[str, dict[str, Any], str], width: int, height: int, noise: bool
) -> None:
    image = Image.effect_noise((width, height), 64).convert("RGB") if noise else \
        Image.new("RGB", (width, height), (1, 2, 3))  # fmt: skip
    data = encode(image, fmt[0], **fmt[1])
    assert read_data_url(data_url(data)) == ImageHeader(fmt[2], *pillow_size(data))


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(kind + payload).to_bytes(4, "big")
    return len(payload).to_bytes(4, "big") + kind + payload + crc


def test_png_size_is_the_last_ihdr_before_the_data_as_in_pillow() -> None:
    """A small IHDR first and a large one later must not pass for small: Pillow takes the
    last one before IDAT."""
    real = encode(Image.new("RGB", (900, 700)), "PNG")
    tiny_ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
    crafted = real[:8] + tiny_ihdr + png_chunk(b"tEXt", b"k\x00v" * 500) + real[8:]
    assert pillow_size(crafted) == (900, 700)
    assert image_header(BytesReader(crafted)) == ImageHeader("png", 900, 700)


def test_jpeg_skips_large_segments_fill_bytes_and_junk_as_pillow_does() -> None:
    real = encode(Image.new("RGB", (321, 123)), "JPEG")
    app = b"\xff\xe1" + (65_000).to_bytes(2, "big") + b"x" * 64_998  # a large EXIF-like APP1
    crafted = real[:2] + app * 3 + b"junk" + b"\xff\xff\xff" + real[2:]
    assert pillow_size(crafted) == (321, 123)
    assert read_data_url(data_url(crafted, "image/jpeg")) == ImageHeader("jpeg", 321, 123)


def test_gif_size_grows_to_the_first_frame_as_in_pillow() -> None:
    real = encode(Image.new("P", (40, 30)), "GIF")
    screen = bytearray(real)
    screen[6:10] = struct.pack("<HH", 10, 10)  # a logical screen smaller than the frame
    assert pillow_size(bytes(screen)) == (40, 30)
    assert image_header(BytesReader(bytes(screen))) == ImageHeader("gif", 40, 30)


def test_animated_gif_with_extensions_reads_as_pillow() -> None:
    frames = [Image.new("P", (64, 48), color) for color in (1, 2, 3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], loop=0,
                   comment=b"c" * 1000, duration=50)  # fmt: skip
    data = buffer.getvalue()
    assert image_header(BytesReader(data)) == ImageHeader("gif", *pillow_size(data))


def test_only_the_header_is_decoded() -> None:
    """The base64 after the header is never decoded: a payload whose tail is not base64
    still gives its size (vLLM refuses it later, which charges nothing)."""
    data = encode(Image.effect_noise((800, 600), 50).convert("RGB"), "JPEG")
    encoded = base64.b64encode(data).decode()
    url = "data:image/jpeg;base64," + encoded[:8192] + "!" * 10_000_000
    assert read_data_url(url) == ImageHeader("jpeg", 800, 600)


def test_base64_reader_gives_any_window_of_the_bytes() -> None:
    data = bytes(range(256)) * 50
    reader = Base64Reader(base64.b64encode(data).decode(), block=30)
    for offset, size in [(0, 1), (1, 2), (29, 3), (31, 100), (12_700, 500), (12_799, 5)]:
        assert reader.read(offset, size) == data[offset : offset + size]
    assert reader.find(0xFF, 0) == 255 and reader.find(0xFF, 256) == 511
    assert reader.find(0xFF, len(data)) == -1


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://example.com/cat.png", "https: URLs are not fetched"),
        ("http://10.0.0.5/internal", "http: URLs are not fetched"),
        ("file:///etc/passwd", "file: URLs are not fetched"),
        ("ftp://x/y.png", "ftp: URLs are not fetched"),
        ("cat.png", "URLs other than data: URLs"),
        ("data:image/png,rawbytes", "must be base64-encoded"),
        ("data:base64,iVBORw0KGgo=", "must be base64-encoded"),
        ("data:image/png;base64", "must be base64-encoded"),
        ("data:image/png;base64,not base64 at all", "not valid base64"),
        ("data:image/png;base64,", "Unsupported image format"),
        ("data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n").decode(), "PNG"),
        ("data:image/jpeg;base64," + base64.b64encode(b"\xff\xd8\xff\xe0\x00").decode(), "JPEG"),
        ("data:image/gif;base64," + base64.b64encode(b"GIF89a\x10\x00").decode(), "GIF"),
        ("data:image/webp;base64," + base64.b64encode(b"RIFF\0\0\0\0WEBPVP8 ").decode(), "WEBP"),
    ],
)
def test_unreadable_or_refused_urls_say_why(url: str, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        read_data_url(url)


@pytest.mark.parametrize(("fmt", "options"), [("BMP", {}), ("TIFF", {}), ("ICO", {})])
def test_formats_other_than_png_jpeg_gif_webp_are_refused(
    fmt: str, options: dict[str, Any]
) -> None:
    data = encode(Image.new("RGB", (32, 32)), fmt, **options)
    with pytest.raises(ImageError, match="Unsupported image format"):
        read_data_url(data_url(data))


def test_an_image_without_pixels_is_refused() -> None:
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 5, 8, 2, 0, 0, 0))
    data = b"\x89PNG\r\n\x1a\n" + ihdr + png_chunk(b"IDAT", b"")
    with pytest.raises(ImageError, match="no pixels"):
        image_header(BytesReader(data))


def test_non_string_url_is_refused() -> None:
    with pytest.raises(ImageError, match="data: URL"):
        read_data_url(None)


# -- the token rule ---------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(
    height=st.integers(1, 20_000),
    width=st.integers(1, 20_000),
    min_pixels=st.integers(1, 200_000),
    extra=st.integers(0, 20_000_000),
    patch=st.sampled_from([14, 16]),
    merge=st.sampled_from([1, 2]),
)
def test_resize_is_transformers_smart_resize(
    height: int, width: int, min_pixels: int, extra: int, patch: int, merge: int
) -> None:
    policy = ImagePolicy(patch, merge, min_pixels, min_pixels + extra, 1)
    factor = patch * merge
    try:
        expected = pil_processing.smart_resize(height, width, factor, min_pixels,
                                               min_pixels + extra)  # fmt: skip
    except ValueError as exc:
        assert "aspect ratio" in str(exc)
        with pytest.raises(ImageError, match="aspect ratio"):
            policy.resized(height, width)
        return
    assert policy.resized(height, width) == expected


def test_transformers_has_one_smart_resize() -> None:
    """The PIL backend's smart_resize (compared with above) is the same code as the
    torchvision backend's, which vLLM imports (read as text: torchvision may be absent)."""
    import inspect
    from pathlib import Path

    source = inspect.getsource(pil_processing.smart_resize)
    torchvision_backend = Path(pil_processing.__file__).with_name("image_processing_qwen2_vl.py")
    assert source in torchvision_backend.read_text(encoding="utf-8")


@pytest.mark.parametrize("policy", [SMALL, DEFAULTS], ids=["small-bounds", "defaults"])
@pytest.mark.parametrize("size", [(1, 1), (13, 2000), (27, 28), (100, 100), (640, 480),
                                  (1000, 9), (56, 56), (1200, 900)])  # fmt: skip
def test_tokens_equal_the_grid_of_transformers_processor(
    policy: ImagePolicy, size: tuple[int, int]
) -> None:
    image = Image.new("RGB", size, (9, 9, 9))
    for processor in processors(policy):
        assert policy.image_tokens(*size) == processor_tokens(processor, image, policy.merge_size)


@settings(max_examples=40, deadline=None)
@given(width=st.integers(1, 700), height=st.integers(1, 700), fmt=st.sampled_from(FORMATS))
def test_tokens_from_header_equal_the_processor_on_the_decoded_image(
    width: int, height: int, fmt: tuple[str, dict[str, Any], str]
) -> None:
    if max(width, height) / min(width, height) > 200:
        return
    data = encode(Image.new("RGB", (width, height), (5, 6, 7)), fmt[0], **fmt[1])
    header = read_data_url(data_url(data))
    with Image.open(io.BytesIO(data)) as image:
        decoded = image.convert("RGB")
    for processor in processors(SMALL):
        expected = processor_tokens(processor, decoded, SMALL.merge_size)
        assert SMALL.image_tokens(header.width, header.height) == expected


def test_tokens_depend_on_pixels_not_file_size() -> None:
    plain = encode(Image.new("RGB", (1024, 768)), "PNG")
    noisy = encode(Image.effect_noise((1024, 768), 90).convert("RGB"), "PNG")
    assert len(noisy) > 20 * len(plain)
    sizes = {read_data_url(data_url(data)) for data in (plain, noisy)}
    assert sizes == {ImageHeader("png", 1024, 768)}
    assert DEFAULTS.image_tokens(1024, 768) == 37 * 27  # resized to 1036 x 756


@settings(max_examples=300, deadline=None)
@given(width=st.integers(1, 30_000), height=st.integers(1, 30_000))
def test_a_rotated_image_costs_the_same(width: int, height: int) -> None:
    """vLLM applies a JPEG's EXIF orientation (which swaps the sides) after reading the
    size; the header's size is the unrotated one, and the count does not change."""
    if max(width, height) / min(width, height) <= 200:
        assert DEFAULTS.image_tokens(width, height) == DEFAULTS.image_tokens(height, width)


def test_aspect_ratio_over_200_is_refused_as_transformers_does() -> None:
    assert DEFAULTS.image_tokens(200, 1) > 0
    with pytest.raises(ImageError, match="aspect ratio"):
        DEFAULTS.image_tokens(201, 1)


# -- which parts are images ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "found"),
    [
        ({"type": "text", "text": "hi"}, None),
        ({"type": "text", "text": "hi", "image_url": {"url": "x"}}, None),  # vLLM: text
        (
            {"type": "image_url", "image_url": {"url": "u", "detail": "low"}},
            ("u", ".image_url.url"),
        ),
        ({"type": "input_image", "image_url": "u"}, ("u", ".image_url")),
        ({"image_url": {"url": "u"}}, ("u", ".image_url.url")),  # no type: by its key
        ({"image_url": "u"}, ("u", ".image_url")),
        ({"type": "image_url", "uuid": "abc", "image_url": None}, (None, ".image_url")),
        ({"type": "made_up"}, None),
    ],
)
def test_image_parts_are_told_apart_as_vllm_does(
    part: dict[str, Any], found: tuple[object, str] | None
) -> None:
    assert image_url_of(part) == found


@pytest.mark.parametrize(
    "part",
    [
        {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
        {"type": "audio_url", "audio_url": {"url": "https://x/a.wav"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "image_embeds", "image_embeds": "AAAA"},
        {"video_url": "https://x/v.mp4"},
        {"uuid": "abc", "audio_url": "https://x/a.wav"},
        {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},  # not an object
    ],
)
def test_other_media_and_malformed_image_parts_are_refused(part: dict[str, Any]) -> None:
    with pytest.raises(ImageError):
        image_url_of(part)
