"""Where the embedded broker keeps its state and listens, and how every client finds a broker.

One discovery rule for the CLI, the SDK, the MCP server and the Jupyter provisioner (`discover`):

1. `FIREPOOL_URL` / `FIREPOOL_TOKEN` (or the URL and token passed explicitly); the URL may be a comma-separated
   list of the brokers of one store (one leads, the others are hot standbys): `Brokers` picks among them;
2. else the state dir named by `--state-dir` (passed as `state_dir`) or `FIREPOOL_STATE_DIR`;
3. else the default state dir, `$XDG_DATA_HOME/firepool`.

A state dir tells clients about its broker through `broker.json` (`{"url", "pid"}`), which the broker
writes once its port is bound and removes at shutdown, and through `token`. A `broker.json` whose pid
is dead is left over from a killed broker: it is ignored, and `Discovery.hint` says what to do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

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

    @property
    def urls(self) -> tuple[str, ...]:
        """The brokers `url` lists (one, or several of one store)."""
        return split_urls(self.url)


def split_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """`"http://a:1, http://b:2/"` or a list of them -> `("http://a:1", "http://b:2")`: blanks dropped,
    trailing slashes cut, duplicates (same scheme://host:port) kept once, the order kept."""
    items = urls.split(",") if isinstance(urls, str) else [part for u in urls for part in u.split(",")]
    found: dict[str, str] = {}
    for item in items:
        url = item.strip().rstrip("/")
        if url:
            found.setdefault(url_key(url), url)
    return tuple(found.values())


def url_key(url: str) -> str:
    """`scheme://host:port`, lower-cased with the default port filled in: how a leader's advertised URL is
    matched to a configured one (`http://Broker-1` is `http://broker-1:80`)."""
    parts = urlsplit(url.strip())
    scheme = (parts.scheme or "http").lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or (443 if scheme in ("https", "wss") else 80)
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


class Brokers:
    """Which of a client's brokers it asks: the one that answered last (sticky), and where it goes next.

    Several brokers may serve one store: one leads, the others answer every route with NotLeader (naming the
    leader when they know it). One instance is shared by all of a client's requests (an async client's
    included: nothing here awaits, so a move is atomic on its loop); each request walks its own `Round`, so
    it tries every broker at most once before it backs off.
    """

    def __init__(self, urls: str | Sequence[str]) -> None:
        self.urls = split_urls(urls)
        if not self.urls:
            raise ValueError("no broker URL given")
        self._keys = [url_key(url) for url in self.urls]
        self._at = 0

    @property
    def current(self) -> str:
        """The broker that answered last (the first one until then)."""
        return self.urls[self._at]

    def ordered(self) -> tuple[str, ...]:
        """Every URL, the current one first: what a client built from this one is given."""
        return self.urls[self._at:] + self.urls[:self._at]

    def index_of(self, url: object) -> int | None:
        """Which configured broker `url` is (scheme://host:port compared), None when it is none of them."""
        if not isinstance(url, str) or not url:
            return None
        key = url_key(url)
        return self._keys.index(key) if key in self._keys else None

    def round(self) -> Round:
        return Round(self)


class Round:
    """One request's walk over the brokers: each is tried at most once before the request backs off."""

    def __init__(self, brokers: Brokers) -> None:
        self._brokers = brokers
        self._at = brokers._at  # a Round is the other half of Brokers: it moves its index
        self._tried: set[int] = set()

    @property
    def url(self) -> str:
        """The broker to send to now."""
        return self._brokers.urls[self._at]

    def answered(self) -> None:
        """The broker tried last answered (anything but NotLeader): the client sticks to it."""
        self._brokers._at = self._at

    def again(self) -> None:
        """The request backed off: a new round, in which every broker may be tried once more."""
        self._tried.clear()

    def move_on(self, leader: object = None) -> bool:
        """The broker tried last did not serve (no answer, or NotLeader naming `leader`): go to the leader when
        it is a configured URL not yet tried in this round, else to the next untried URL round-robin. True when
        there is one (try it at once); False when every URL was tried: the request backs off (`again`), then
        asks the leader named or the next URL."""
        brokers, n = self._brokers, len(self._brokers.urls)
        self._tried.add(self._at)
        hint = brokers.index_of(leader)
        ahead = [i for i in ((self._at + k) % n for k in range(1, n)) if i not in self._tried]
        fresh = (hint is not None and hint not in self._tried) or bool(ahead)
        if hint is not None and (hint not in self._tried or not ahead):
            nxt = hint
        else:
            nxt = ahead[0] if ahead else (self._at + 1) % n
        if brokers._at == self._at:  # a request that moved on already does not move it again
            brokers._at = nxt
        self._at = nxt
        return fresh


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


def discover(url: str | Sequence[str] | None = None, token: str | None = None,
             state_dir: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Discovery:
    """The broker every client talks to: see the module docstring for the order."""
    env = os.environ if env is None else env
    state = state_dir_for(state_dir, env)
    hint = ""
    urls = split_urls(url or "")
    if urls:
        source = "argument"
    elif split_urls(env.get("FIREPOOL_URL", "")):
        urls, source = split_urls(env["FIREPOOL_URL"]), "environment"
    else:
        announced, hint = read_broker_file(state)
        source = "broker.json"
        if announced is None:
            announced, source = f"http://127.0.0.1:{DEFAULT_PORT}", "default"
        urls = split_urls(announced)
    token = token or env.get("FIREPOOL_TOKEN") or ""
    if not token:
        try:
            token = read_private(state / TOKEN_FILE).strip()
        except InsecureFileError:
            raise
        except OSError:
            token = ""
    return Discovery(url=",".join(urls), token=token, source=source, hint=hint)


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
