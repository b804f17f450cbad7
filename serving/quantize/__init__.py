"""Weight quantization for serving: AWQ 4-bit checkpoints in the layout vLLM loads."""
