"""The simulator's package: venue models, workload plans and statistics, and the discrete-event engine.

Never imported by the broker's runtime (an import-linter contract in pyproject.toml pins it): only this
package and the benchmarks (`bench/`) import `broker.sim`. The engine drives the real control-plane code
(tracker, scaler, holds, standby, dispatcher) on the virtual clock; the modules here are plain data.
"""
