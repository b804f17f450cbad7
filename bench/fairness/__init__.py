"""Fair sharing benchmark: a quiet key's time to first token while a noisy key floods the
engine, with vLLM's first-come-first-served queue and with the gateway's fair queue.

    make bench-fairness        # python -m bench.fairness; ~10 min; bench/results/fairness/<date>.md

One real vLLM engine (the cpu-tiny profile, its compute bound to core 0) and one gateway per
setting in front of it (core 1): `--scheduling fcfs`, and `--scheduling fair` with each
`--reserved-slots` of the curve. Two keys: the quiet one sends a short stream at a steady rate,
the noisy one keeps several times the engine's `max_num_seqs` long streams going. Each run
measures the quiet key alone, then under the flood through every gateway, interleaved, and
reads vLLM's own generated-token counter for the throughput. Medians over the runs.
"""
