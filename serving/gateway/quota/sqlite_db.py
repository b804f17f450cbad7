"""keys.db opened one way: every SQLite store connects through `connect` here.

The key store, the budget journal, the usage ledger and the adapter registry share one file
(`serving/paths.py`), so they share how it is opened: autocommit (each store runs single
statements or its own BEGIN IMMEDIATE ... COMMIT), usable from the worker threads the stores
run their calls in (each store serialises its own calls), and one busy timeout, written here
once, for a writer that finds the file locked by another.

    conn = connect(path)          # the key store, the adapter registry, a usage report
    conn = connect_wal(path, 5)   # the budget journal and the usage ledger's writer
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

# Long enough for another process's commit (a `serving keys` run, another gateway's group
# commit) to finish, short enough that a file held for good fails a call instead of hanging.
DEFAULT_BUSY_TIMEOUT_S = 5.0


def connect(path: Path, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """A connection to `path` in autocommit mode, for any thread, with the busy timeout."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    return conn


def connect_wal(path: Path, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """`connect`, for the frequent writers: WAL, and synchronous=NORMAL (a commit survives a
    killed process; a power cut may lose the last ones, which budgets and usage can afford)."""
    conn = connect(path, busy_timeout_s)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn
