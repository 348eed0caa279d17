"""Writes the seed corpora (fuzz/corpus/server, fuzz/corpus/client) in the harnesses' input
layout: `python fuzz/seeds.py`. Each seed is named for what it shows; the fuzzer's own finds go
to fuzz/generated/, never here."""

from __future__ import annotations

import pathlib

from fuzzlib import encode

HERE = pathlib.Path(__file__).parent

# Server: flags byte (server_framing.FLAG_* and answer kind << 2), the MORE_* byte, tick byte,
# then the reads.
RESPOND, STREAM, STREAM_OPEN, FAIL, FAIL_MID_STREAM, RESPOND_UNREAD = (k << 2 for k in range(2, 8))
EOF, RESET, PUSH_BACK, ECHO, YIELD = 1, 2, 1 << 5, 1 << 6, 1 << 7
ECHO_TEXT = 1 << 8  # the MORE_* byte, shifted up here: (flags | ECHO_TEXT) splits in two


def post(body: bytes, *extra: bytes, path: bytes = b"/mcp", version: bytes = b"1.1") -> bytes:
    head = b"POST %s HTTP/%s\r\nHost: t\r\n" % (path, version)
    head += b"".join(line + b"\r\n" for line in extra)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def chunked(*chunks: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    return b"POST /mcp HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + body


SERVER = {
    "post": (RESPOND, 0, [], post(b'{"jsonrpc":"2.0"}')),
    "post-split": (RESPOND | YIELD, 0, [5, 20, 40], post(b'{"a":1}')),
    "pipelined": (
        RESPOND | YIELD,
        0,
        [30],
        b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" + post(b"abc") + chunked(b"xy", b"z"),
    ),
    "pipelined-eof": (STREAM | EOF, 0, [], post(b"1") + post(b"22") + post(b"333")),
    "chunked-stream": (STREAM | PUSH_BACK, 0, [47, 52], chunked(b"hello", b" world")),
    "stream-open": (STREAM_OPEN, 0, [], post(b"x")),
    "expect-100": (
        RESPOND,
        0,
        [74],
        b"POST /mcp HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\nbody",
    ),
    "http10-stream": (STREAM, 0, [], post(b"ten", version=b"1.0")),
    "http10-keepalive": (RESPOND, 0, [], post(b"k", b"Connection: keep-alive", version=b"1.0")),
    "upgrade-body": (
        RESPOND,
        0,
        [60],
        post(b"h2body", b"Connection: Upgrade, HTTP2-Settings", b"Upgrade: h2c") + post(b"no"),
    ),
    "upgrade-chunked": (
        RESPOND,
        0,
        [],
        chunked(b"a").replace(b"Host", b"Connection: Upgrade\r\nUpgrade: h2c\r\nHost"),
    ),
    "head-echo": (RESPOND | ECHO, 0, [], b"HEAD / HTTP/1.1\r\nHost: t\r\nX-Echo: v\xe9\r\n\r\n"),
    "echo": (RESPOND | ECHO, 0, [], post(b"e", b"X-Echo: a b\tc")),
    "echo-text": (STREAM | ECHO | ECHO_TEXT, 0, [], post(b"e", b"X-Echo: \xff\xfe") + post(b"f")),
    "budget": (RESPOND | YIELD, 0, [], post(b"a" * 200) + post(b"b" * 200) + post(b"c" * 200)),
    "max-requests": (RESPOND, 0, [], b"".join(post(b"%d" % i) for i in range(6))),
    "no-host": (RESPOND, 0, [], b"POST /mcp HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
    "http10-te": (RESPOND, 0, [], chunked(b"a").replace(b"HTTP/1.1", b"HTTP/1.0")),
    "fail": (FAIL, 0, [], post(b"f") + post(b"g")),
    "fail-mid-stream": (FAIL_MID_STREAM, 0, [], post(b"f")),
    "unread": (RESPOND_UNREAD, 0, [40], post(b"0123456789")),
    "too-large": (RESPOND, 0, [], post(b"x" * 300)),
    "timeout": (RESPOND, 64, [30], post(b"slow")),
    "reset": (STREAM | RESET, 0, [], post(b"r")),
    "cl-and-te": (RESPOND, 0, [], post(b"0\r\n\r\n", b"Transfer-Encoding: chunked")),
    "two-lengths": (RESPOND, 0, [], post(b"abc", b"Content-Length: 3")),
    "bare-lf": (RESPOND, 0, [], b"POST /mcp HTTP/1.1\nHost: t\nContent-Length: 0\n\n"),
    "obs-fold": (RESPOND, 0, [], post(b"", b"X-A: a\r\n b")),
    "long-header": (RESPOND, 0, [], post(b"", b"X-Long: " + b"l" * 300)),
    "many-headers": (RESPOND, 0, [], post(b"", *(b"X-%d: v" % i for i in range(10)))),
    "bad-chunk": (RESPOND, 0, [], chunked(b"abc").replace(b"3\r\n", b"zz\r\n")),
    "garbage": (RESPOND, 0, [], b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"),
}

# Client: flags byte (mode | end << 2 | FLAG_NEXT), tick byte, read limit (2 bytes), the reads.
READ, ITERATE, ONE_CHUNK, CLOSE = range(4)
END_EOF, END_RESET, END_SILENT, END_LOST = (e << 2 for e in range(4))
NEXT = 1 << 4

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'
SSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in (b"data: one\n\n", b"data: two\n\n"))
    + b"0\r\n\r\n"
)

CLIENT = {
    "json": (READ, 0, 1024, [], OK),
    "json-split": (READ, 0, 1024, [9, 30, 70], OK),
    "json-too-large": (READ, 0, 4, [], OK),
    "sse": (ITERATE, 0, 0, [40, 85, 100], SSE),
    "sse-one-chunk": (ONE_CHUNK, 0, 0, [90], SSE),
    "close-at-head": (CLOSE, 0, 0, [], SSE),
    "close-delimited": (ITERATE | END_EOF, 0, 0, [], b"HTTP/1.1 200 OK\r\n\r\ndata: a\n\n"),
    "close-delimited-reset": (READ | END_RESET, 0, 99, [], b"HTTP/1.0 200 OK\r\n\r\nabc"),
    "http10-lost": (READ | END_LOST, 0, 99, [], b"HTTP/1.0 200 OK\r\n\r\nabc"),
    "interim-100": (READ, 0, 99, [25], b"HTTP/1.1 100 Continue\r\n\r\n" + OK),
    "interim-103": (
        ITERATE,
        0,
        0,
        [],
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n" + SSE,
    ),
    "switching": (READ, 0, 99, [], b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\nx"),
    "two-answers": (READ, 0, 99, [], OK + OK),
    "pooled-next": (READ | NEXT, 0, 99, [len(OK)], OK + OK),
    "pooled-stray": (READ, 0, 99, [len(OK)], OK + b"HTTP/1.1 204 No Content\r\n\r\n"),
    "silent": (READ | END_SILENT, 0, 99, [], OK[:-3]),
    "deadline": (ITERATE, 80, 0, [90, 110], SSE),
    "no-content": (READ, 0, 0, [], b"HTTP/1.1 204 No Content\r\nContent-Length: 4\r\n\r\n"),
    "gzip-coding": (
        READ | END_EOF,
        0,
        99,
        [],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nz",
    ),
    "cl-and-te": (READ, 0, 99, [], OK.replace(b"Content-Type", b"Transfer-Encoding: chunked")),
    "bad-chunk": (ITERATE, 0, 0, [], SSE.replace(b"\r\n\r\nb\r\n", b"\r\n\r\nq\r\n", 1)),
    "short-body": (READ | END_EOF, 0, 99, [], OK[:-4]),
    "bad-status": (READ, 0, 99, [], b"HTTP/1.1 2000 OK\r\n\r\n"),
    "garbage": (READ, 0, 99, [], b"SSH-2.0-OpenSSH_9.6\r\n"),
    "many-fields": (
        READ,
        0,
        99,
        [],
        OK.replace(b"\r\n\r\n", b"".join(b"\r\nX-%d: v" % i for i in range(9)) + b"\r\n\r\n"),
    ),
    "long-field": (
        READ,
        0,
        99,
        [],
        OK.replace(b"Content-Type", b"X-Long: " + b"l" * 130 + b"\r\nContent-Type"),
    ),
    "endless-interims": (
        READ,
        0,
        99,
        [400, 800, 1200],
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" * 40 + OK,
    ),
}


def main() -> None:
    for name, (flags, tick, cuts, payload) in SERVER.items():
        write("server", name, encode(bytes([flags & 0xFF, flags >> 8, tick]), cuts, payload))
    for name, (flags, tick, limit, cuts, payload) in CLIENT.items():
        control = bytes([flags, tick]) + limit.to_bytes(2, "little")
        write("client", name, encode(control, cuts, payload))


def write(side: str, name: str, data: bytes) -> None:
    folder = HERE / "corpus" / side
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


if __name__ == "__main__":
    main()
