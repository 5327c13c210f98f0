"""How the broker is reached: loopback or not, TLS or plain HTTP, and the operator's explicit consent
(`--insecure-http`) to serve bearer tokens and dashboard cookies in clear beyond this host.

A broker bound beyond loopback over plain HTTP sends every caller's token across the network readable
by anyone on the path, so it starts only when asked to (`firepool serve --insecure-http`), and then says
so in its log and in `/healthz` (`"transport": "http-insecure"`). Behind a TLS-terminating reverse proxy
on the same host, bind the broker to loopback and pass `--forwarded-allow-ips` (docs/security.md).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass


def is_loopback(host: str) -> bool:
    """True for an address only this host reaches (127.0.0.0/8, ::1, `localhost`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve beyond this host


@dataclass(frozen=True)
class Exposure:
    host: str = "127.0.0.1"
    tls: bool = False
    """Served over HTTPS (`--tls-cert`, `--tls-key`)."""
    insecure_http: bool = False
    """`--insecure-http`: plain HTTP beyond loopback, the operator's explicit choice."""

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def transport(self) -> str:
        """`https`, `http` (loopback only) or `http-insecure` (beyond loopback, by request)."""
        if self.tls:
            return "https"
        return "http" if self.loopback else "http-insecure"

    @property
    def secure_cookies(self) -> bool:
        """Dashboard cookies are Secure unless the broker is plain HTTP on loopback: beyond loopback a
        browser should reach it only through TLS (the broker's own, or a proxy's)."""
        return self.tls or not self.loopback

    def refusal(self) -> str | None:
        """Why the broker must not start this way, in one line; None when it may."""
        if self.tls or self.loopback or self.insecure_http:
            return None
        return (f"--host {self.host} serves plain HTTP beyond this machine (bearer tokens and dashboard cookies "
                "in clear): give --tls-cert FILE --tls-key FILE, bind 127.0.0.1 behind a TLS proxy "
                "(--forwarded-allow-ips), or pass --insecure-http to accept it")
