"""Benchmarks that measure paths side by side in one run and write results files."""
