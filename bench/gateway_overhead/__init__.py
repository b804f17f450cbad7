"""How much the gateway costs: the same load direct, through a minimal passthrough, through
`serving gateway` (quotas in-process, and in Redis with `--redis-url`) and through LiteLLM's
proxy, side by side in one run (docs/architecture.md, performance targets; the Redis
store's share of the in-process store's requests/s and its Redis commands per request: the
scale-out issue).

    python -m bench.gateway_overhead            # ~4 min; results/gateway_overhead/<date>.*
    python -m bench.gateway_overhead --quick    # under a minute, for tests
    python -m bench.gateway_overhead --real-engine URL --gateway-url URL --api-key KEY

Modules: `upstream` (the fast fake vLLM), `passthrough` (the minimal proxy), `load` (the
load generator), `processes` and `paths` (starting what is measured), `redis_server` (the
Redis store's server and its command counters), `litellm_proxy` (its throwaway venv),
`runner` (interleaved rounds), `report` and `table` (ratios, targets, output), `profile`
(py-spy), `local` and `real_engine` (the two modes).
"""
