"""What `firepool serve` checks before it starts anything, each failure one line naming the flag.

A malformed tokens file names the line or entry that is wrong (never quoting a key: it may be a token);
a `--db` URL whose driver is missing names the extra that installs it (never echoing the URL: it may
hold a password); a broker bound beyond loopback over plain HTTP is refused unless the operator passes
`--insecure-http`. Every check raises ValueError with the message the CLI prints.
"""

from __future__ import annotations

from pathlib import Path

from broker.api.exposure import Exposure


def tokens_file(path: Path) -> None:
    """The tokens file as the broker will read it."""
    from broker.api.auth import TokenAuth

    try:
        TokenAuth.from_file(path)
    except ValueError as exc:
        raise ValueError(f"--tokens {exc}") from None


def db_url(url: str) -> None:
    """A job store URL with an unknown scheme or a driver that is not installed."""
    import sqlalchemy as sa

    from broker.store.engines import require_driver

    try:
        require_driver(url)
    except sa.exc.ArgumentError as exc:
        raise ValueError(f"--db: {exc}") from None


def exposure(host: str, tls_cert: str | None, tls_key: str | None, insecure_http: bool) -> Exposure:
    """TLS files given as a pair and readable; plain HTTP beyond loopback only with --insecure-http."""
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path:
            try:
                Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None
    found = Exposure(host, tls=bool(tls_cert), insecure_http=insecure_http)
    refusal = found.refusal()
    if refusal:
        raise ValueError(refusal)
    return found
