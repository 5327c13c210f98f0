"""How the examples fail: a user's mistake or a missing broker is one line on stderr and a non-zero exit.

`run_main(main)` runs an example's main and turns the SDK's typed errors (no broker, a refused token, an
unknown pool), an HTTP error of a plain-HTTP example and Ctrl-C into that line; a bug still shows its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import httpx

from broker.errors import FirepoolError


def one_line(exc: BaseException) -> str:
    """The reason, on one line: the broker's error class and message, or the HTTP client's."""
    if isinstance(exc, FirepoolError):
        text = f"{exc.error_class}: {exc.message}"
    elif isinstance(exc, httpx.HTTPStatusError):
        text = f"HTTP {exc.response.status_code} from {exc.request.url}: {exc.response.text[:200]}"
    elif isinstance(exc, httpx.TransportError):
        text = f"cannot reach the broker at {exc.request.url.copy_with(path='/', query=None)} ({exc or type(exc).__name__})"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def run_main(main: Callable[[], int]) -> NoReturn:
    """sys.exit with main's code; its expected failures as one line `NAME: reason` and exit 1."""
    name = Path(sys.argv[0]).name
    try:
        code = main()
    except (FirepoolError, httpx.HTTPError) as exc:
        print(f"{name}: {one_line(exc)}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
