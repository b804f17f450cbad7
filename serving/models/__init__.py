"""Models the stack builds itself instead of downloading: the tiny Qwen3 and its tokenizer."""
