"""Usage ledger: every settled request's tokens, per key, model and UTC day, kept for reports.

days          UTC days and retention: which day a record belongs to, when a day is dropped
tally         what the event loop adds up between two writes (one dict update per request)
recorder      `UsageRecorder`: the tally, written in the background in numbered batches
sqlite_store  `SqliteUsageStore`: table `usage_days` in keys.db (gateways without Redis)
redis_store   `RedisUsageStore`: one hash per day in Redis (replicas sharing Redis)
report        the report: its query, the one JSON shape, and that JSON as CSV or a table

Imported from their modules: the package itself imports nothing, so `serving usage` and
the gateway's settings load only what they use.
"""
