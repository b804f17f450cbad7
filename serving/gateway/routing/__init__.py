"""Routing over several vLLM engines: the rotation and policies (`router`) and prefix
affinity (`prefix_affinity`)."""

from serving.gateway.routing.prefix_affinity import prefix_hashes, prompt_text
from serving.gateway.routing.router import Engine, Policy, Router

__all__ = ["Engine", "Policy", "Router", "prefix_hashes", "prompt_text"]
