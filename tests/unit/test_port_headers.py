"""What the port proxy passes between a client and a sandbox server (broker.api.porthttp): pure."""

from __future__ import annotations

from broker.api.porthttp import Forward, downstream_headers, upstream_headers, without_broker_cookies

FWD = Forward(8000, "/v1/sessions/web/ports/8000", "/x")


def scope(*headers: tuple[str, str]) -> dict[str, object]:
    return {"type": "http", "scheme": "https", "client": ("10.0.0.9", 5555),
            "headers": [(k.encode(), v.encode()) for k, v in headers]}


def test_upstream_drops_hop_by_hop_listed_and_credential_headers_and_adds_forwarding() -> None:
    got = dict(upstream_headers(scope(("Host", "b.example"), ("Authorization", "Bearer secret"),
                                      ("Connection", "keep-alive, X-Private"), ("X-Private", "1"),
                                      ("Keep-Alive", "5"), ("TE", "trailers"), ("Proxy-Authorization", "x"),
                                      ("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-Prefix", "/evil"),
                                      ("Cookie", "firepool_port=t; a=1; firepool_session=s"), ("Accept", "*/*")),
                               FWD))
    assert got == {b"host": b"b.example", b"accept": b"*/*", b"cookie": b"a=1",
                   b"x-forwarded-for": b"1.2.3.4, 10.0.0.9", b"x-forwarded-proto": b"https",
                   b"x-forwarded-host": b"b.example", b"x-forwarded-prefix": FWD.prefix.encode()}


def test_a_request_without_host_gets_one_and_the_host_form_no_prefix() -> None:
    got = upstream_headers(scope(("Cookie", "firepool_port=t")), Forward(8000, "", "/"))
    assert got[0] == (b"host", b"localhost")
    assert b"cookie" not in dict(got) and b"x-forwarded-prefix" not in dict(got)


def test_downstream_keeps_redirects_under_the_prefix_and_never_sets_a_broker_cookie() -> None:
    got = downstream_headers([(b"Location", b"/sub/"), (b"Set-Cookie", b"firepool_session=x; Path=/ui"),
                              (b"Set-Cookie", b"app=1"), (b"Transfer-Encoding", b"chunked"),
                              (b"Connection", b"close, X-Hop"), (b"X-Hop", b"1"), (b"Content-Type", b"text/html")],
                             FWD)
    assert got == [(b"location", FWD.prefix.encode() + b"/sub/"), (b"set-cookie", b"app=1"),
                   (b"content-type", b"text/html")]
    for kept in (b"https://elsewhere/x", b"//elsewhere/x", b"rel/x", FWD.prefix.encode() + b"/already"):
        assert downstream_headers([(b"location", kept)], FWD) == [(b"location", kept)]
    assert downstream_headers([(b"location", b"/x")], Forward(8000, "", "/")) == [(b"location", b"/x")]


def test_only_the_brokers_cookies_are_taken_out() -> None:
    assert without_broker_cookies(b"a=1;firepool_port=x ;  b=2; firepool_=y") == b"a=1; b=2"
    assert without_broker_cookies(b"firepool_port=x") == b""


def test_the_sdk_names_a_session_port_with_its_tag_quoted() -> None:
    from broker.client import port_url

    assert port_url("http://b:1/", "web", 8000) == "http://b:1/v1/sessions/web/ports/8000/"
    assert port_url("http://b:1", "a/b c", 8000) == "http://b:1/v1/sessions/a%2Fb%20c/ports/8000/"


def test_a_raw_path_reaches_the_server_in_bytes_http_can_carry() -> None:
    from broker.api.portproxy import _ascii

    raw = "/a b/ü?x=1&y=%20".encode().decode("latin-1")  # as uvicorn hands over a client's unescaped UTF-8
    assert _ascii(raw) == "/a%20b/%C3%BC?x=1&y=%20"
