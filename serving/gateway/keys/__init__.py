"""API keys: records with their limits, hashed secrets, and the stores that hold them.

`SqliteKeyStore` (embedded default, written by `serving keys`) and `FileKeyStore` (a
read-only declarative file, e.g. a Kubernetes Secret) both satisfy `KeyStore`, and so does
`redis_store.RedisKeyStore` (keys shared by gateway replicas, written by `serving keys
--redis-url`), kept fresh in a gateway by `redis_refresh.RedisKeyRefresh`. Those two are
imported from their modules, not from here: `serving keys` with a SQLite store should not
pay for importing the Redis client (asyncio, hiredis).
"""

from serving.gateway.keys.credentials import hash_secret, is_key_id, key_id_of, new_secret
from serving.gateway.keys.file_store import FileKeyStore, load_keys_file, render_keys_yaml
from serving.gateway.keys.record import KeyRecord, KeySpec
from serving.gateway.keys.sqlite_store import SqliteKeyStore
from serving.gateway.keys.store import KeyStore

__all__ = [
    "FileKeyStore",
    "KeyRecord",
    "KeySpec",
    "KeyStore",
    "SqliteKeyStore",
    "hash_secret",
    "is_key_id",
    "key_id_of",
    "load_keys_file",
    "new_secret",
    "render_keys_yaml",
]
