"""Benchmarks: each prints our figures beside the paper's (`firepool bench NAME`, `--json` for one object)."""
