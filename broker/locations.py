"""Where the embedded broker keeps its state and listens, and how every client finds a broker.

One discovery rule for the CLI, the SDK, the MCP server and the Jupyter provisioner (`discover`):

1. `FIREPOOL_URL` / `FIREPOOL_TOKEN` (or the URL and token passed explicitly);
2. else the state dir named by `--state-dir` (passed as `state_dir`) or `FIREPOOL_STATE_DIR`;
3. else the default state dir, `$XDG_DATA_HOME/firepool`.

A state dir tells clients about its broker through `broker.json` (`{"url", "pid"}`), which the broker
writes once its port is bound and removes at shutdown, and through `token`. A `broker.json` whose pid
is dead is left over from a killed broker: it is ignored, and `Discovery.hint` says what to do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 8321
BROKER_FILE = "broker.json"
TOKEN_FILE = "token"
HOW_TO_START = "start one with `firepool serve`, or point at a broker with FIREPOOL_URL (and FIREPOOL_TOKEN)"


def default_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_DATA_HOME/firepool` (default `~/.local/share/firepool`)."""
    env = os.environ if env is None else env
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "firepool"


def state_dir_for(state_dir: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path:
    """`state_dir` if given, else `$FIREPOOL_STATE_DIR`, else the default state dir."""
    env = os.environ if env is None else env
    if state_dir:
        return Path(state_dir)
    if env.get("FIREPOOL_STATE_DIR"):
        return Path(env["FIREPOOL_STATE_DIR"])
    return default_state_dir(env)


@dataclass(frozen=True)
class Discovery:
    """Where a client will talk to, and how it was found (for messages when the broker does not answer)."""

    url: str
    token: str
    source: str
    """`argument`, `environment`, `broker.json` or `default` (nothing found: the default local address)."""
    hint: str = ""
    """What to do when this address does not answer (empty when the address came from the user)."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def read_broker_file(state_dir: Path) -> tuple[str | None, str]:
    """The URL in `<state_dir>/broker.json` when its broker is alive, else None and why not."""
    path = state_dir / BROKER_FILE
    try:
        data = json.loads(path.read_text())
        url, pid = str(data["url"]), int(data["pid"])
    except FileNotFoundError:
        return None, f"no broker is running for state dir {state_dir} (no {BROKER_FILE}): {HOW_TO_START}"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{path} is unreadable ({exc}): {HOW_TO_START}"
    if not pid_alive(pid):
        return None, (f"{path} is left over from a broker that is gone (pid {pid} is not running); "
                      f"ignoring it: {HOW_TO_START}")
    return url, ""


def discover(url: str | None = None, token: str | None = None, state_dir: str | os.PathLike[str] | None = None,
             env: Mapping[str, str] | None = None) -> Discovery:
    """The broker every client talks to: see the module docstring for the order."""
    env = os.environ if env is None else env
    state = state_dir_for(state_dir, env)
    hint = ""
    if url:
        source = "argument"
    elif env.get("FIREPOOL_URL"):
        url, source = env["FIREPOOL_URL"], "environment"
    else:
        url, hint = read_broker_file(state)
        source = "broker.json"
        if url is None:
            url, source = f"http://127.0.0.1:{DEFAULT_PORT}", "default"
    token = token or env.get("FIREPOOL_TOKEN") or ""
    if not token:
        try:
            token = read_private(state / TOKEN_FILE).strip()
        except InsecureFileError:
            raise
        except OSError:
            token = ""
    return Discovery(url=url.rstrip("/"), token=token, source=source, hint=hint)


class InsecureFileError(PermissionError):
    """A file holding a secret in clear that others may read: refused, as ssh refuses an open key."""


def read_private(path: Path) -> str:
    """The text of a file that holds a token in clear (one that must be sent on, so it cannot be stored
    hashed); InsecureFileError when its group or others may read or write it."""
    with path.open() as f:
        mode = os.fstat(f.fileno()).st_mode & 0o777
        if mode & 0o077:
            raise InsecureFileError(1, f"permissions {mode:04o} are too open for a file holding tokens in clear; "
                                       f"`chmod 600` it", str(path))
        return f.read()
