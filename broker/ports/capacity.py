"""The capacity-source port: per GPU model, reserved capacity that is unused now and may be borrowed.

A cluster's capacity controller publishes it; Firepool polls. `StaticCapacitySource` is the fake (tests
set figures directly), `FileCapacitySource` reads a JSON file (the embedded default: an operator or a
stub controller writes it), `HttpCapacitySource` GETs the same JSON from a URL. The document maps a
model to a number of GPUs, or to {"unused": N}. A failed read raises `Unavailable`; the caller keeps
the previous figures for that tick.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from broker.errors import Unavailable


class CapacitySource(Protocol):
    blocking: bool
    """True when `read` does I/O (the caller runs it in a thread)."""

    def read(self) -> Mapping[str, float]:
        """GPUs per model that may be borrowed now (a model not named offers nothing)."""
        ...


def parse_capacity(doc: Any) -> dict[str, float]:
    """Validate a published capacity document into {model: GPUs}."""
    if not isinstance(doc, Mapping):
        raise Unavailable("capacity document must be a JSON object of model -> GPUs")
    out: dict[str, float] = {}
    for model, value in doc.items():
        if isinstance(value, Mapping):
            value = value.get("unused")
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or not math.isfinite(value):
            raise Unavailable(f"capacity for {model!r} must be a non-negative number, got {value!r}")
        out[str(model)] = float(value)
    return out


class StaticCapacitySource:
    """In-memory figures: the fake beside the port."""

    blocking = False

    def __init__(self, figures: Mapping[str, float] | None = None) -> None:
        self.figures: dict[str, float] = dict(figures or {})
        self.fail = False

    def set(self, model: str, gpus: float) -> None:
        self.figures[model] = gpus

    def read(self) -> Mapping[str, float]:
        if self.fail:
            raise Unavailable("capacity source unreachable")
        return dict(self.figures)


class FileCapacitySource:
    """A JSON file; a missing file publishes nothing."""

    blocking = True

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> Mapping[str, float]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise Unavailable(f"cannot read capacity file {self.path}: {exc}") from exc
        try:
            return parse_capacity(json.loads(text))
        except json.JSONDecodeError as exc:
            raise Unavailable(f"capacity file {self.path} is not JSON: {exc}") from exc


class HttpCapacitySource:
    """GET a URL that returns the capacity document."""

    blocking = True

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def read(self) -> Mapping[str, float]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:  # noqa: S310 (operator URL)
                return parse_capacity(json.loads(resp.read()))
        except (OSError, urllib.error.URLError, json.JSONDecodeError) as exc:
            raise Unavailable(f"capacity source {self.url} failed: {exc}") from exc
