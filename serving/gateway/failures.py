"""The root of every exception the gateway defines: one tree, so one `except` catches them all
and a reader finds each here (tests/gateway/test_failures.py holds every class to this tree).

    GatewayException
    ├── GatewayError                 errors.py: a failure the client is answered with (status,
    │   │                            OpenAI type and code); its subclasses are listed there
    │   └── ...                      (also UsageNotRecordedError, UsageStoreUnavailableError,
    │                                AdapterStoreError, EnginesOwnAdapterError)
    ├── ClientGone                   errors.py: the client went away before it was answered
    ├── HopError                     hop_connection.py: the exchange with an engine failed
    │   ├── HopConnectError          no connection (refused, unreachable, timed out)
    │   ├── HopTimeoutError          the engine went silent (also a TimeoutError)
    │   ├── HopDisconnectedError     closed before the response (also a ConnectionError)
    │   ├── HopPayloadError          the body was cut off or malformed
    │   └── HopProtocolError         not an HTTP/1.1 response
    ├── RedisError                   quota/redis_connection.py: a Redis command failed
    │   ├── RedisConnectionError     the connection is gone (also a ConnectionError)
    │   │   └── RedisConnectError    none could be opened: the command was never sent
    │   ├── RedisTimeoutError        no reply by the deadline (also a TimeoutError)
    │   ├── RedisReplyError          Redis answered with an error
    │   └── RedisProtocolError       the bytes are not RESP
    ├── QuotaStoreUnavailable        quota/store.py: the quota store did not answer in time
    ├── KeyStoreUnavailable          keys/redis_store.py (also a ServingError, for the CLI)
    ├── AdapterStoreUnavailable      adapters/registry.py (also a ServingError)
    ├── QueueTimeout                 fair_queue.py: no slot within the queue's timeout
    ├── BeyondContext                quota/engine.py: max_tokens no context holds (ValueError)
    ├── ImageError                   images.py: an image that cannot be accepted (ValueError)
    ├── ReportQueryError             usage_ledger/report.py: a query that cannot run (ValueError)
    └── LookupFailed                 routing/discovery.py: the nameserver gave no answer

Only `GatewayError`s reach a client as they are; `GatewayApp._api` turns the others into one
(a silent store: 503; a client gone: no answer); anything outside the tree is a bug: a logged 500.
"""

from __future__ import annotations


class GatewayException(Exception):
    """Every exception the gateway defines derives from this."""
