"""Benchmarks and kernel tools of the suite (``benchmarks/ops``); run from the repository root."""
