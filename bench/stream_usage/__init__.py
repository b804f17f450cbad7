"""What the gateway's running usage costs vLLM: its API server's CPU per chat stream when
every chunk carries usage (`stream_options.continuous_usage_stats`, which the gateway asks
for on every stream so that a stream cut short is charged vLLM's own count) against usage
in the last chunk only.

    make bench-stream-usage  # python -m bench.stream_usage; ~3 min; results/stream_usage/<date>.md

One real vLLM engine (the cpu-tiny profile, compute and API server bound to core 0, as in the
fairness benchmark), one stream at a time straight to it, interleaved rounds. With a reasoning
parser (Qwen3's) and thinking off, vLLM 0.32 recounts the reasoning tokens of the whole
answer for every chunk that carries usage by decoding and re-parsing everything generated so
far (`ParserEngineReasoningAdapter.count_reasoning_tokens` when its streaming count is not
valid), so the running usage costs its API server time that grows with the square of the
answer's length. With thinking on the count is kept as the answer streams and costs nothing.
"""
