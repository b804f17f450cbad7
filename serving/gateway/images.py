"""Images in chat requests: what one costs in prompt tokens, read from its header
(docs/images.md).

    policy = ImagePolicy.from_settings(settings)
    header = read_data_url("data:image/png;base64,iVBORw0...")   # ImageHeader("png", w, h)
    tokens = policy.image_tokens(header.width, header.height)    # Qwen2-VL / Qwen2.5-VL rule

Rules:
- an image's tokens depend on its pixel size alone: resized as the vision encoder does
  (`resized`, transformers' `smart_resize`), one token per merge x merge block of patches,
  the count vLLM's Qwen2-VL processor puts in the prompt;
- the size is read from the header (PNG, JPEG, GIF, WEBP) as Pillow reads it, decoding only
  the header's base64, in windows (`Base64Reader`), however large the image;
- only `data:` URLs: the size must be known before tokens are reserved, and an engine
  fetching URLs would let any key make requests from inside the cluster (SSRF); other media
  and references by `uuid` alone are refused, their cost being unknown here.
"""

from __future__ import annotations

import binascii
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from serving.gateway.failures import GatewayException

if TYPE_CHECKING:
    from serving.gateway.settings import GatewaySettings

# vision_start + vision_end around each image's pads, the separator vLLM may put between
# content parts, and "Picture N: " when a request sets the chat template's add_vision_id.
IMAGE_PART_TOKENS = 16
# transformers' smart_resize refuses images more elongated than this.
MAX_ASPECT_RATIO = 200
# Structures (chunks, segments, blocks) a header walk may visit before giving up, so a
# crafted image cannot hold the event loop: real images have a few dozen.
MAX_HEADER_STEPS = 65_536

# vLLM's content part types (renderers/chat_utils.py, MM_PARSER_MAP) by what they carry.
IMAGE_PART_TYPES = ("image_url", "input_image")
TEXT_PART_TYPES = ("text", "input_text", "output_text", "refusal", "thinking", "tool_reference")
OTHER_MEDIA = (
    "image_pil",
    "image_embeds",
    "audio_url",
    "input_audio",
    "audio_embeds",
    "video_url",
    "video_embeds",
    "prompt_embeds",
)


class ImageError(GatewayException, ValueError):
    """An image the gateway cannot accept; the message is shown to the client."""


class ImageHeader(NamedTuple):
    format: str
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class ImagePolicy:
    """The resize rule of the served model's image processor and the per-request limit."""

    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    max_images: int

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ImagePolicy:
        return cls(
            patch_size=settings.image_patch_size,
            merge_size=settings.image_merge_size,
            min_pixels=settings.image_min_pixels,
            max_pixels=settings.image_max_pixels,
            max_images=settings.max_images_per_request,
        )

    @classmethod
    def defaults(cls) -> ImagePolicy:
        """The settings' defaults (they are written once, in `GatewaySettings`)."""
        from serving.gateway.settings import GatewaySettings

        fields = GatewaySettings.model_fields
        names = {
            "patch_size": "image_patch_size",
            "merge_size": "image_merge_size",
            "min_pixels": "image_min_pixels",
            "max_pixels": "image_max_pixels",
            "max_images": "max_images_per_request",
        }
        return cls(**{name: fields[setting].default for name, setting in names.items()})

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) the processor resizes to: transformers' `smart_resize`, step for
        step (Python's round, the same float operations), so the counts agree exactly."""
        if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
            raise ImageError(
                f"The image is {width}x{height} pixels; its aspect ratio must be at most "
                f"{MAX_ASPECT_RATIO}:1."
            )
        factor = self.patch_size * self.merge_size
        h_bar = round(height / factor) * factor
        w_bar = round(width / factor) * factor
        if h_bar * w_bar > self.max_pixels:
            beta = math.sqrt((height * width) / self.max_pixels)
            h_bar = max(factor, math.floor(height / beta / factor) * factor)
            w_bar = max(factor, math.floor(width / beta / factor) * factor)
        elif h_bar * w_bar < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h_bar = math.ceil(height * beta / factor) * factor
            w_bar = math.ceil(width * beta / factor) * factor
        return h_bar, w_bar

    def image_tokens(self, width: int, height: int) -> int:
        """The image pad tokens vLLM puts in the prompt for one image of this size."""
        h_bar, w_bar = self.resized(height, width)
        patches = (h_bar // self.patch_size) * (w_bar // self.patch_size)
        return patches // (self.merge_size * self.merge_size)


def image_url_of(part: dict[str, Any]) -> tuple[object, str] | None:
    """(URL, its path inside the part) of an image content part; None for a part without
    media. Mirrors how vLLM tells parts apart: by `type` when it is a known one and no `uuid`
    is given, else by which media key is present. Other media: `ImageError`."""
    kind = part.get("type")
    if isinstance(kind, str) and kind in (*IMAGE_PART_TYPES, *OTHER_MEDIA) and "uuid" not in part:
        if kind in OTHER_MEDIA:
            raise ImageError(_other_media(kind))
        value = part.get("image_url")
        if kind == "image_url":
            if not isinstance(value, dict):
                raise ImageError("'image_url' must be an object with a 'url'.")
            return value.get("url"), ".image_url.url"
        return value, ".image_url"  # input_image: the URL itself
    if kind is not None and "uuid" not in part:
        return None  # text, or a type vLLM refuses itself
    if "image_url" in part or kind in IMAGE_PART_TYPES:  # with a uuid: maybe a reference
        value = part.get("image_url")
        if isinstance(value, dict):
            return value.get("url"), ".image_url.url"
        return value, ".image_url"
    for key in OTHER_MEDIA:
        if key in part:
            raise ImageError(_other_media(key))
    return None


def _other_media(kind: str) -> str:
    return (
        f"Content parts of type '{kind}' are not accepted here; send text and images "
        "(image_url with a data: URL)."
    )


def read_data_url(url: object) -> ImageHeader:
    """The format and size of the image in a base64 `data:` URL, from its header alone."""
    if not isinstance(url, str):
        raise ImageError(
            "Send an image as a base64 data: URL (data:image/png;base64,...); references to "
            "images sent earlier are not accepted."
        )
    if url[:5].lower() != "data:":
        scheme = url[: url.find(":", 0, 16)].lower() if ":" in url[:16] else ""
        what = f"{scheme}: URLs" if scheme.isalpha() else "URLs other than data: URLs"
        raise ImageError(
            f"Images must be sent inline as base64 data: URLs (data:image/png;base64,...); "
            f"{what} are not fetched by this server."
        )
    # The same split as vLLM's MediaConnector: data:[<mediatype>][;<param>]*;base64,<data>
    # (by index: the payload is megabytes, and is not copied)
    comma = url.find(",", 5)
    _, semicolon, encoding = url[5 : comma if comma >= 0 else 5].rpartition(";")
    if comma < 0 or not semicolon or encoding != "base64":
        raise ImageError("Image data: URLs must be base64-encoded (data:image/png;base64,...).")
    return image_header(Base64Reader(url, start=comma + 1))


class Base64Reader:
    """Random access to the bytes that base64 text (`text[start:]`) encodes, decoding only
    the blocks read: every 4 characters are 3 bytes, so byte n lies in characters 4*(n//3)
    onwards. Decoding is strict (the alphabet, padding only at the end), as vLLM's is."""

    BLOCK = 3 * 1024

    def __init__(self, text: str, block: int = BLOCK, *, start: int = 0) -> None:
        self._text = text
        self._start = start
        self._block = block
        self._cached: tuple[int, bytes] = (-1, b"")

    def _decode(self, index: int) -> bytes:
        if self._cached[0] == index:
            return self._cached[1]
        first = self._start + index * self._block // 3 * 4
        chars = self._text[first : first + self._block // 3 * 4]
        try:
            data = binascii.a2b_base64(chars, strict_mode=True) if chars else b""
        except (binascii.Error, ValueError):
            raise ImageError("The image data is not valid base64.") from None
        self._cached = (index, data)
        return data

    def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes at `offset` (fewer at the end of the data)."""
        out = b""
        while size > 0:
            index, start = divmod(offset, self._block)
            piece = self._decode(index)[start : start + size]
            if not piece:
                break
            out += piece
            offset += len(piece)
            size -= len(piece)
        return out

    def find(self, byte: int, offset: int) -> int:
        """Offset of the first `byte` at or after `offset`, -1 if there is none."""
        while True:
            index, start = divmod(offset, self._block)
            block = self._decode(index)
            if start >= len(block):
                return -1
            found = block.find(byte, start)
            if found >= 0:
                return index * self._block + found
            offset = (index + 1) * self._block


class BytesReader(Base64Reader):
    """The same access to plain bytes (tests, and files already decoded)."""

    def __init__(self, data: bytes) -> None:
        super().__init__("", block=max(len(data), 1))
        self._cached = (0, data)


def image_header(data: Base64Reader) -> ImageHeader:
    start = data.read(0, 16)
    parsers: list[tuple[Callable[[bytes], bool], Callable[[Base64Reader], ImageHeader]]] = [
        (lambda s: s.startswith(b"\x89PNG\r\n\x1a\n"), _png),
        (lambda s: s.startswith(b"\xff\xd8\xff"), _jpeg),
        (lambda s: s[:6] in (b"GIF87a", b"GIF89a"), _gif),
        (lambda s: s[:4] == b"RIFF" and s[8:15] == b"WEBPVP8", _webp),
    ]
    for accepts, parse in parsers:
        if accepts(start):
            header = parse(data)
            if header.width < 1 or header.height < 1:
                raise ImageError(f"The {header.format.upper()} image has no pixels.")
            return header
    raise ImageError("Unsupported image format: send PNG, JPEG, GIF or WEBP.")


def _unreadable(kind: str) -> ImageError:
    return ImageError(f"The {kind} image header is truncated or corrupt.")


def _png(data: Base64Reader) -> ImageHeader:
    # Pillow reads chunks up to the first IDAT (or fdAT, IEND); the last IHDR before it
    # sets the size.
    size: tuple[int, int] | None = None
    offset = 8
    for _ in range(MAX_HEADER_STEPS):
        head = data.read(offset, 8)
        if len(head) < 8 or not head[4:].isalpha():
            break
        length, kind = int.from_bytes(head[:4], "big"), head[4:]
        if kind in (b"IDAT", b"fdAT", b"IEND"):
            if size is None:
                break
            return ImageHeader("png", *size)
        if kind == b"IHDR":
            ihdr = data.read(offset + 8, 8)
            if length < 13 or len(ihdr) < 8:
                break
            size = int.from_bytes(ihdr[:4], "big"), int.from_bytes(ihdr[4:], "big")
        offset += 12 + length
    raise _unreadable("PNG")


# Pillow's JpegImagePlugin.MARKER by what its handler does: a start of frame (the size), a
# segment with a length to skip, a marker without one. Any other marker is an error there.
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xDE}
_JPEG_SEGMENT = {0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD, 0xDF, *range(0xE0, 0xF0), 0xFE}
_JPEG_BARE = {0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)}


def _jpeg(data: Base64Reader) -> ImageHeader:
    # Pillow walks markers to the start of scan; each start of frame sets the size.
    size: tuple[int, int] | None = None
    offset = 2
    for _ in range(MAX_HEADER_STEPS):
        offset = data.find(0xFF, offset)  # bytes between markers are skipped, as there
        if offset < 0:
            break
        marker = data.read(offset + 1, 1)
        if not marker:
            break
        code = marker[0]
        if code == 0xFF:  # fill byte: the second 0xFF may start the marker
            offset += 1
        elif code == 0x00 or code in _JPEG_BARE:
            offset += 2
        elif code in _JPEG_SOF or code in _JPEG_SEGMENT:
            segment = data.read(offset + 2, 7)
            if len(segment) < 2:
                break
            length = int.from_bytes(segment[:2], "big")
            if code in _JPEG_SOF:
                if len(segment) < 7 or length < 7:
                    break
                height = int.from_bytes(segment[3:5], "big")
                size = int.from_bytes(segment[5:7], "big"), height
            if code == 0xDA:
                if size is None:
                    break
                return ImageHeader("jpeg", *size)
            offset += 2 + max(length, 2)  # the length counts itself
        else:
            break
    raise _unreadable("JPEG")


def _gif(data: Base64Reader) -> ImageHeader:
    # Pillow: the logical screen, grown to the first frame's extent if that lies outside.
    screen = data.read(6, 5)
    if len(screen) < 5:
        raise _unreadable("GIF")
    width, height = int.from_bytes(screen[:2], "little"), int.from_bytes(screen[2:4], "little")
    offset = 13 + (3 << ((screen[4] & 7) + 1) if screen[4] & 0x80 else 0)
    steps = 0
    while steps < MAX_HEADER_STEPS:
        steps += 1
        tag = data.read(offset, 1)
        if not tag or tag == b";":
            break
        if tag == b",":
            frame = data.read(offset + 1, 8)
            if len(frame) < 8:
                break
            x0, y0, w, h = (int.from_bytes(frame[i : i + 2], "little") for i in (0, 2, 4, 6))
            return ImageHeader("gif", max(width, x0 + w), max(height, y0 + h))
        if tag == b"!":  # extension: a label, then sub-blocks up to an empty one
            offset += 2
            while steps < MAX_HEADER_STEPS:
                steps += 1
                size = data.read(offset, 1)
                if not size:
                    raise _unreadable("GIF")
                offset += 1 + size[0]
                if size[0] == 0:
                    break
        else:  # Pillow skips unknown bytes
            offset += 1
    raise _unreadable("GIF")


def _webp(data: Base64Reader) -> ImageHeader:
    # Pillow's WebPImagePlugin._get_size: the first chunk of a simple or extended file.
    head = data.read(0, 30)
    chunk = head[12:16]
    if chunk == b"VP8 " and len(head) >= 30 and head[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(head[26:28], "little") & 0x3FFF
        return ImageHeader("webp", width, int.from_bytes(head[28:30], "little") & 0x3FFF)
    if chunk == b"VP8X" and len(head) >= 30:
        width = int.from_bytes(head[24:27], "little") + 1
        return ImageHeader("webp", width, int.from_bytes(head[27:30], "little") + 1)
    if chunk == b"VP8L" and len(head) >= 25 and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    raise _unreadable("WEBP")
