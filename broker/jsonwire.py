"""JSON on the per-job paths (agent calls, watch streams): orjson, ~5x the stdlib's speed, with the stdlib's answer
for the rare value orjson refuses (an integer past 64 bits, a non-string key, NaN written by an older agent)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # raises json.JSONDecodeError (orjson's is a subclass) if the stdlib refuses it too
