"""Routing across vLLM replicas: vLLM's own router (`vllm-router`) against routing inside our
gateway, side by side in one run (issue 11, part 3).

    python -m bench.routing                       # ~10 min; results/routing/<date>.*
    python -m bench.routing --quick               # short (both parts; engines take ~1 min)
    python -m bench.routing --quick --parts overhead

Two parts:
- overhead: two fast fake upstreams, each path in front of them (vllm-router with its
  policies, our gateway with `--routing`, and our gateway in front of vllm-router, the stack
  users would run if routing were the router's), measured with the gateway overhead
  benchmark's load generator in interleaved rounds: added latency one at a time, req/s and
  streams/s at 32 concurrent, CPU per request of each proxy process;
- cache: two real engines (`serving engine --profile cpu-tiny`), a shared-prefix multi-turn
  workload through each path, and vLLM's own prefix cache hit rate and request split.

Modules: `router` (vllm-router's command line), `gateway` (our gateway with several
upstreams), `paths` (what each path starts), `overhead` and `prefix_cache` (the two parts),
`engines` (the real engines: start, reset, counters), `workload` (the conversations),
`table` (the Markdown). Paths a checkout cannot run (no vllm-router installed, a gateway
without `--routing`) are skipped and the results say why.
"""
