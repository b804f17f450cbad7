"""The API gateway in front of vLLM: keys, quotas, OpenAI errors, streaming passthrough.

One streamed chat completion, in the order a reader follows it:

    server        uvicorn with read deadlines and the SIGTERM drain
    app           routes; auth; the body; metered paths to `completions`, others to `proxy`
    completions   parse -> admit (reserve) -> forward -> settle, in one handler
    openai_request  the body: 400s, max_tokens, prompt estimate, the body sent upstream
    images        an image's prompt tokens from its header (the model's resize rule)
    quota/        the limits, the decision, the engine that reserves and settles, stores
    proxy         the exchange with vLLM, relayed chunk by chunk; `usage` reads it on the way
    errors        every error and every mapping into one (hop failures, refusals, labels)
    metrics       the `gateway_*` series, observed once per request

Beside it: `settings` (one model: flags and environment variables), `auth` and `keys/`,
`upstream` (the hop client), `health` and `catalog` (what the upstream serves, /readyz),
`periodic` (background jobs), `forwarded_headers`, `responses`, `types` (ASGI aliases),
`model_images` (a model's image rule as settings, for `serving up`).
"""
