"""`firepool bench NAME` offers exactly the benchmarks that exist."""

from __future__ import annotations

import importlib

from broker.cli import BENCHMARKS


def test_every_offered_benchmark_has_a_module_with_main() -> None:
    for name in BENCHMARKS:
        module = importlib.import_module("bench." + name.replace("-", "_"))
        assert callable(module.main), name
