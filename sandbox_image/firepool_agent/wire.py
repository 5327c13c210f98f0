"""The agent's request shapes: strict JSON bodies and query parameters, checked field by field.

An unknown field or a wrong type is a 400, never silently ignored: a broker and an agent that
disagree about the protocol should fail loudly at the first request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from firepool_agent import limits
from firepool_agent.attempt import LaunchSpec, ResetSpec
from firepool_agent.attempts import SIGNALS
from firepool_agent.output import STREAMS, cap_of

MAX_WAIT_S = 600.0
MAX_INLINE_LOGS = 1 << 20
"""The most log bytes a status may carry inline (`inline_logs=`)."""
MAX_LOG_CHUNK = 16 << 20


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _object(raw: bytes, allowed: set[str], required: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise HttpError(400, f"the body is not JSON: {exc}") from None
    return _fields(body, "the body", allowed, required)


def _fields(body: Any, name: str, allowed: set[str],
            required: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """`body` checked as a JSON object of only `allowed` fields, `required` among them."""
    if not isinstance(body, dict):
        raise HttpError(400, f"{name} must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise HttpError(400, f"unknown field(s): {', '.join(unknown)}")
    missing = sorted(required - set(body))
    if missing:
        raise HttpError(400, f"missing field(s): {', '.join(missing)}")
    return body


def _string(name: str, value: Any, *, optional: bool = False, nonempty: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or "\0" in value or (nonempty and not value):
        raise HttpError(400, f"{name} must be a{' non-empty' if nonempty else ''} string without NUL")
    return value


def _number(name: str, value: Any, *, optional: bool = False, minimum: float = 0.0) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < minimum:
        raise HttpError(400, f"{name} must be a number >= {minimum}")
    return float(value)


def _paths(name: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p.startswith("/") and "\0" not in p
                                              for p in value):
        raise HttpError(400, f"{name} must be a list of absolute paths")
    return tuple(value)


def parse_launch(raw: bytes) -> LaunchSpec:
    body = _object(raw, {"attempt_id", "argv", "env", "session", "cwd", "timeout_s", "extra", "reset_after"},
                   {"attempt_id", "argv", "session"})
    attempt_id = _string("attempt_id", body["attempt_id"], nonempty=True)
    assert attempt_id is not None
    if len(attempt_id) > 256:
        raise HttpError(400, "attempt_id is longer than 256 characters")
    argv = body["argv"]
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or not argv[0]:
        raise HttpError(400, "argv must be a non-empty list of strings without NUL")
    env = body.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise HttpError(400, "env must be an object of strings")
    try:  # the broker checked the caller's part against the same limits; this covers what it added
        limits.check_argv(argv, "argv")
        limits.check_env(env, names=limits.ANY_ENV_NAME)
        limits.check_exec(argv, env, limits.exec_limit())
    except limits.LimitError as exc:
        raise HttpError(400, exc.message) from None
    extra = body.get("extra") or {}
    if not isinstance(extra, dict):
        raise HttpError(400, "extra must be an object")
    try:
        cap_of(extra)
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None
    timeout = _number("timeout_s", body.get("timeout_s"), optional=True)
    if timeout is not None and timeout <= 0:
        raise HttpError(400, "timeout_s must be positive")
    reset_after = body.get("reset_after")
    if reset_after is not None:
        reset_after = _reset(_fields(reset_after, "reset_after", RESET_FIELDS))
    return LaunchSpec(attempt_id=attempt_id, argv=tuple(argv), env=env,
                      session=_string("session", body["session"]) or "",
                      cwd=_string("cwd", body.get("cwd"), optional=True), timeout_s=timeout, extra=extra,
                      reset_after=reset_after)


def parse_reset(raw: bytes) -> ResetSpec:
    return _reset(_object(raw, RESET_FIELDS))


RESET_FIELDS = {"wipe_workspace", "wipe_paths", "keep_paths"}


def _reset(body: dict[str, Any]) -> ResetSpec:
    """A reset's fields, checked: `POST /v1/reset`'s body, or a launch's `reset_after`."""
    wipe_workspace = body.get("wipe_workspace", False)
    if not isinstance(wipe_workspace, bool):
        raise HttpError(400, "wipe_workspace must be a boolean")
    return ResetSpec(wipe_workspace=wipe_workspace, wipe_paths=_paths("wipe_paths", body.get("wipe_paths", [])),
                     keep_paths=_paths("keep_paths", body.get("keep_paths", [])))


def parse_kernels(raw: bytes) -> bool:
    """`POST /v1/kernels`: whether the pod's pool serves kernels (a `learned` pod keeps one while it does)."""
    keep = _object(raw, {"keep"}, {"keep"})["keep"]
    if not isinstance(keep, bool):
        raise HttpError(400, "keep must be a boolean")
    return keep


def parse_signal(raw: bytes) -> str:
    body = _object(raw, {"signal"}, {"signal"})
    name = body["signal"]
    if not isinstance(name, str) or name.upper().removeprefix("SIG") not in SIGNALS:
        raise HttpError(400, f"signal must be one of {', '.join(SIGNALS)}")
    return name.upper().removeprefix("SIG")


def parse_cancel(raw: bytes) -> float:
    body = _object(raw, {"grace_s"})
    grace = _number("grace_s", body.get("grace_s", 5.0))
    assert grace is not None
    return min(grace, MAX_WAIT_S)


def query_number(query: Mapping[str, list[str]], name: str, default: float, maximum: float) -> float:
    values = query.get(name)
    if not values:
        return default
    try:
        value = float(values[-1])
    except ValueError:
        raise HttpError(400, f"{name} must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise HttpError(400, f"{name} must be a non-negative number")
    return min(value, maximum)


def query_int(query: Mapping[str, list[str]], name: str, default: int, maximum: int) -> int:
    values = query.get(name)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError:
        raise HttpError(400, f"{name} must be an integer") from None
    if value < 0:
        raise HttpError(400, f"{name} must not be negative")
    return min(value, maximum)


def query_stream(query: Mapping[str, list[str]]) -> str:
    stream = (query.get("stream") or ["combined"])[-1]
    if stream not in STREAMS:
        raise HttpError(400, f"stream must be one of {', '.join(STREAMS)}")
    return stream
