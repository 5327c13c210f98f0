"""`firepool bench all`: every registered benchmark once, rows concatenated, a broken one shown as a miss."""

from __future__ import annotations

import json
from typing import Any

import pytest

import bench.all as bench_all
from broker.cli import BENCHMARKS


def test_all_runs_every_other_registered_benchmark_once_in_order(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    ran: list[str] = []

    def fake(name: str, timeout_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        ran.append(name)
        if name == "reset":
            return [bench_all._failed(name, "exit 1, no rows")], {"rc": 1, "wall_s": 0.1}
        row = {"id": name, "metric": "m", "ours": 1.0, "unit": "s", "paper": "p", "target": "t", "met": True}
        return [row], {"rc": 0, "wall_s": 0.1}

    monkeypatch.setattr(bench_all, "run_one", fake)
    monkeypatch.setattr(bench_all, "report", lambda name, rows, json_out, extra: print(json.dumps(
        {"rows": [r.__dict__ for r in rows], **extra})) or 0)
    assert bench_all.main([], json_out=True) == 0
    expected = [b for b in BENCHMARKS if b != "all"]
    assert ran == expected
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out["rows"]] == [("-" if b == "reset" else b) for b in expected]
    assert out["rows"][expected.index("reset")]["met"] is False
    assert set(out["benchmarks"]) == set(expected)


def test_only_and_skip_name_registered_benchmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(bench_all, "run_one", lambda name, t: (ran.append(name) or [], {"rc": 0, "wall_s": 0}))
    monkeypatch.setattr(bench_all, "report", lambda *a, **k: 0)
    bench_all.main(["--only", "tracker,loops", "--skip", "loops"])
    assert ran == ["tracker"]
    with pytest.raises(SystemExit):
        bench_all.main(["--only", "chess"])


def test_the_last_json_line_of_a_benchmarks_output_is_its_result() -> None:
    text = 'progress\n{"rows": [1]}\nnot json {\n{"rows": [2]}\n'
    assert bench_all._last_json(text) == {"rows": [2]}
    assert bench_all._last_json("no json here") is None
