"""broker.jsonwire: orjson's bytes where it can, the standard library's answer where orjson refuses a value."""

from __future__ import annotations

import json
import math

import pytest

from broker import jsonwire


def test_compact_utf8_that_reads_back_as_the_standard_library_reads_it() -> None:
    value = {"argv": ["echo", "héllo"], "env": {"A": "1"}, "n": 3, "t": 1.5, "none": None, "ok": True, "tup": (1, 2)}
    assert json.loads(jsonwire.dumps(value)) == json.loads(json.dumps(value))
    assert b" " not in jsonwire.dumps({"a": [1, 2]})


def test_values_orjson_refuses_go_through_the_standard_library() -> None:
    assert json.loads(jsonwire.dumps({"big": 2**70})) == {"big": 2**70}
    assert json.loads(jsonwire.dumps({1: "x"})) == {"1": "x"}


def test_nan_written_by_the_standard_library_still_reads() -> None:
    assert math.isnan(jsonwire.loads(json.dumps({"x": float("nan")}))["x"])


def test_malformed_json_raises_the_standard_decode_error() -> None:
    with pytest.raises(json.JSONDecodeError):
        jsonwire.loads(b"{not json")
