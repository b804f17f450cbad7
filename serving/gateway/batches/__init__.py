"""OpenAI's Files and Batches API, per key (docs/batches.md): files kept in SQLite and on
disk, batches validated then run line by line through the metered path in the fair queue's
lowest class."""
