"""`POST /v1/files`' multipart body, streamed: the `file` part straight into a temporary
file (`contents.FileContents.writer`), never whole in memory, refused with 413 as soon as it
passes the size limit (the temporary is removed); the small fields (`purpose`) kept.

    upload = await read_upload(receive, content_type, handle, limit=settings.max_batch_file_bytes)
    upload.fields["purpose"], upload.filename, upload.size
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from serving.gateway.errors import BodyTooLargeError, ClientGone, InvalidRequestError
from serving.gateway.types import Receive

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FILE_FIELD = "file"
# Form fields other than the file are a word or two (`purpose`, `expires_after[...]`).
_FIELD_LIMIT = 1024


@dataclass
class Upload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    size: int = 0
    has_file: bool = False


class _Parts:
    """The parser's callbacks: which part is open, where its bytes go."""

    def __init__(self, sink: BinaryIO, limit: int) -> None:
        self.upload = Upload()
        self._sink = sink
        self._limit = limit
        self._header_name = b""
        self._header_value = b""
        self._name: str | None = None
        self._is_file = False
        self._value = bytearray()
        self.too_large = False

    def on_part_begin(self) -> None:
        self._name, self._is_file, self._value = None, False, bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            _, options = parse_options_header(self._header_value)
            self._name = options.get(b"name", b"").decode("utf-8", "replace")
            if self._name == FILE_FIELD:
                self._is_file = self.upload.has_file = True
                filename = options.get(b"filename")
                self.upload.filename = filename.decode("utf-8", "replace") if filename else None
        self._header_name = self._header_value = b""

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._is_file:
            self.upload.size += end - start
            if self.upload.size > self._limit:
                self.too_large = True
                return
            self._sink.write(data[start:end])
        elif len(self._value) + end - start <= _FIELD_LIMIT:
            self._value += data[start:end]

    def on_part_end(self) -> None:
        if self._name and not self._is_file:
            self.upload.fields[self._name] = self._value.decode("utf-8", "replace")


async def read_upload(
    receive: Receive, content_type: bytes | None, sink: BinaryIO, *, limit: int
) -> Upload:
    """The form's fields, its `file` part written to `sink`; 400 for a body that is not
    multipart/form-data, 413 past `limit` bytes of file."""
    kind, options = parse_options_header(content_type or b"")
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise InvalidRequestError("The body must be multipart/form-data with a boundary.")
    parts = _Parts(sink, limit)
    parser = MultipartParser(boundary, callbacks=_callbacks(parts))
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk: bytes = message.get("body", b"")
            if chunk:
                parser.write(chunk)
                if parts.too_large:
                    raise BodyTooLargeError(f"The file is larger than {limit} bytes.", param="file")
            if not message.get("more_body", False):
                break
        parser.finalize()
    except MultipartParseError as exc:
        raise InvalidRequestError(f"The multipart body does not parse: {exc}.") from None
    if not parts.upload.has_file:
        raise InvalidRequestError("The form has no `file` part.", param="file")
    return parts.upload


def _callbacks(parts: _Parts) -> MultipartCallbacks:
    return {
        "on_part_begin": parts.on_part_begin,
        "on_header_field": parts.on_header_field,
        "on_header_value": parts.on_header_value,
        "on_header_end": parts.on_header_end,
        "on_part_data": parts.on_part_data,
        "on_part_end": parts.on_part_end,
    }
