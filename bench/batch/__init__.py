"""What batch work costs interactive latency: `make bench-batch` (`python -m bench.batch`).

One real cpu-tiny engine behind one gateway with a keys db (the Batch API is served only with
one), two keys: an interactive tenant and a batch tenant, as the Batch API's claim is about an
interactive tenant beside someone else's batch. Each run measures, in a row: the interactive
key alone (a closed loop of short streamed chats, time to first token each), a batch alone
(vLLM's generated tokens/s while it runs: the engine's otherwise idle throughput the batch
takes) and both together. Goal: TTFT median <= 1.2x alone, worst <= 1.5x, batch tokens/s
>= 80% of alone. Results: bench/results/batch/<date>.md and .json.

    .venv/bin/python -m bench.batch --runs 3
"""
