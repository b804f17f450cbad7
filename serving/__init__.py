"""Serving stack for Qwen models on vLLM."""
