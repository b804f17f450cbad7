"""Fair sharing benchmark: a quiet key's time to first token while a noisy key floods the
engine, with vLLM's first-come-first-served queue and with the gateway's fair queue.

    make bench-fairness        # python -m bench.fairness; ~20 min; bench/results/fairness/<date>.md

One real vLLM engine (the cpu-tiny profile, its compute bound to core 0) and one gateway per
setting in front of it (core 1): `--scheduling fcfs`, and `--scheduling fair` with each
`--reserved-slots` asked for; and (`--replicas 2`, the default; `replicas`) two fair gateway
replicas sharing the engine's slots through one Redis, measured with the flood through one
replica and the quiet key through the other, and with both through both. Two keys: the quiet
one sends a short stream at a steady rate, the noisy one keeps a flood of long streams going,
at each size asked for (`--noisy-streams`, 1x, 2x and 4x the engine's `max_num_seqs` by
default). Each run measures the quiet key alone, then under each flood through every gateway,
and reads vLLM's own generated-token counter for the throughput; the quiet key's median, p99
and worst first token are judged run by run.
"""
