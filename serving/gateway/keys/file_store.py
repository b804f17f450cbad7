"""A read-only key store from a declarative YAML or JSON file, e.g. a mounted Kubernetes Secret.

The file holds one or more YAML documents, each `keys: [<entry>, ...]` (entries as in
`record`), so `serving keys create --emit-yaml >> keys.yaml` appends a valid document.
The store re-reads the file when it changes (mtime, size or inode: a Secret update swaps a
symlink), checking at most once per `check_interval`. A change that does not parse fails
closed: the store accepts none of its keys until the file parses again (`broken` says why,
and so do a log line and the gateway_keys_file_up metric), since the edit may have been a
revocation. Keeping the last good keys would keep a revoked key working.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from serving.errors import ServingError
from serving.gateway.keys.record import KeyRecord
from serving.gateway.keys.store import authenticate_with

log = logging.getLogger(__name__)

_Signature = tuple[int, int, int]


class FileKeyStore:
    """Usage: `FileKeyStore(Path("/etc/serving/keys.yaml"))`."""

    def __init__(
        self,
        path: Path,
        *,
        check_interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._check_interval = check_interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._signature = _signature(path)
        self._records = load_keys_file(path)  # a bad file at start-up is an error, not a log
        self._checked_at = monotonic()
        self.broken: str | None = None
        """Why the file's last change could not be loaded (its keys are refused); None
        while it is loaded."""

    def get(self, key_id: str) -> KeyRecord | None:
        self.reload_if_changed()
        return self._records.get(key_id)

    def list_keys(self) -> list[KeyRecord]:
        self.reload_if_changed()
        return sorted(self._records.values(), key=lambda record: (record.created_at, record.key_id))

    def authenticate(self, secret: str) -> KeyRecord | None:
        return authenticate_with(self, secret)

    def reload_if_changed(self, *, force: bool = False) -> bool:
        """Re-read the file if it changed; True if new records were loaded."""
        now = self._monotonic()
        if not force and now - self._checked_at < self._check_interval:
            return False
        with self._lock:
            self._checked_at = now
            signature: _Signature | None = None
            try:
                signature = _signature(self.path)
                if signature == self._signature and not force:
                    return False
                records = load_keys_file(self.path)
            except (OSError, ServingError) as exc:
                if self.broken is None or signature != self._signature:
                    log.error("refusing every key of %s until it loads again: %s", self.path, exc)
                self._records, self._signature = {}, signature or (0, 0, 0)
                self.broken = str(exc)
                return False
            if self.broken is not None:
                log.warning("keys file %s loads again: its keys are accepted", self.path)
            self._records, self._signature, self.broken = records, signature, None
            return True

    def close(self) -> None:
        pass


def load_keys_file(path: Path) -> dict[str, KeyRecord]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ServingError(f"keys file {path}: {exc.strerror or exc}") from None
    try:
        documents: list[Any] = (
            [json.loads(text)] if path.suffix == ".json" else list(yaml.safe_load_all(text))
        )
    except (ValueError, yaml.YAMLError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ServingError(f"keys file {path}: not valid YAML/JSON: {first_line}") from None
    records: dict[str, KeyRecord] = {}
    for number, document in enumerate(documents, start=1):
        if document is None:
            continue  # an empty document, e.g. a leading `---`
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise ServingError(f"keys file {path}: document {number} must be `keys: [...]`")
        for index, entry in enumerate(entries):
            record = KeyRecord.from_document(entry, where=f"{path}: keys[{index}]")
            if record.key_id in records:
                raise ServingError(f"keys file {path}: key id {record.key_id} appears twice")
            records[record.key_id] = record
    return records


def render_keys_yaml(records: Iterable[KeyRecord]) -> str:
    """One YAML document `keys: [...]` (starting with `---`) for a keys file or Secret."""
    body = yaml.safe_dump(
        {"keys": [record.to_document() for record in records]},
        sort_keys=False,
        default_flow_style=False,
    )
    return "---\n" + body


def _signature(path: Path) -> _Signature:
    stat = os.stat(path)  # follows symlinks: a Secret's ..data swap changes the target
    return stat.st_mtime_ns, stat.st_size, stat.st_ino
