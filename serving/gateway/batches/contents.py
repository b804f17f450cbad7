"""The files' contents on disk: one file per id in a directory, each written under a
temporary name and renamed into place, so a reader never sees half a file and a crash
leaves only temporaries (removed when the directory is opened again).

    contents = FileContents(Path("var/batch-files"))
    with contents.writer() as part: part.write(chunk); ...; contents.commit(part, file_id)
    contents.path(file_id).read_bytes(); contents.delete(file_id)
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_TEMP_SUFFIX = ".part"


class FileContents:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.directory = directory
        for leftover in directory.glob("*" + _TEMP_SUFFIX):
            leftover.unlink(missing_ok=True)

    def path(self, file_id: str) -> Path:
        return self.directory / file_id

    @contextlib.contextmanager
    def writer(self) -> Iterator[BinaryIO]:
        """A temporary file to write into; removed on leaving unless `commit` took it."""
        temp = self.directory / (secrets.token_hex(8) + _TEMP_SUFFIX)
        try:
            with open(temp, "xb") as handle:
                yield handle
        finally:
            temp.unlink(missing_ok=True)

    def commit(self, handle: BinaryIO, file_id: str) -> None:
        """Make what `handle` (from `writer`) holds the contents of `file_id`, durably."""
        handle.flush()
        os.fsync(handle.fileno())
        os.replace(handle.name, self.path(file_id))

    def write(self, file_id: str, data: bytes) -> None:
        with self.writer() as handle:
            handle.write(data)
            self.commit(handle, file_id)

    def delete(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)
