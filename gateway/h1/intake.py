"""A client connection's bytes into requests: llhttp (httptools) fed slice by slice, so that it
completes at most one request beyond the one being answered (the rest waits unparsed, the
stash), and its callbacks, which bound each head and body and judge its framing. Built on the
requests in hand (gateway/h1/answering.py); HTTPConnection (gateway/h1/server.py) on this."""

from __future__ import annotations

import httptools

from gateway.h1.answering import Answering
from gateway.h1.limits import OVER_BUDGET, Limits, Refused, RequestBytes, too_large
from gateway.h1.link import BROKEN, CLOSING, STARTING
from gateway.h1.request import DownstreamRequest, Refusal
from gateway.h1.wire import HEAD_END, KNOWN_HOSTS, host_ok, parse_reason, target_path


class Intake(Answering):
    """The parsing side of one connection (the base of HTTPConnection)."""

    def __init__(self, limits: Limits, budget: RequestBytes, refusal: Refusal) -> None:
        super().__init__(limits, budget, refusal)
        # Read on every header of every request: kept as plain attributes.
        self._max_line = limits.max_header_bytes
        self._max_fields = limits.max_headers
        self._head_bound = limits.head_bound
        self._parser = httptools.HttpRequestParser(self)
        self._url = b""
        self._head_bytes = 0  # fed while the head has not ended (an unfinished line included)
        self._head_size = 0  # the parsed head's request line and header lines
        self._requests = 0  # requests whose head was parsed on this connection

    def _consume(self, data: bytes) -> None:
        """Parse `data` up to the end of the first request beyond the one being answered; the
        rest waits unparsed (the stash) until that request's turn comes. llhttp cannot stop
        mid-buffer, so the buffer is fed in slices: each ends where a head ends (CRLF CRLF,
        which strict llhttp requires) or, in a body of known length, where the body ends. A
        slice then completes at most one head, and parsing stops once a request waits."""
        if data and self._takes_bytes():
            rest = self._feed_slices(data, data.find(HEAD_END))
            if rest and self._takes_bytes():
                if self._hold(len(rest)):
                    self._stash = rest
                else:
                    self._over_budget()

    def _feed_slices(self, data: bytes, cut: int) -> bytes:
        """Feed `data` slice by slice; returns what is left unparsed once a request waits."""
        view = memoryview(data)
        pos = 0
        end = len(data)
        while pos < end:
            if self._queue or self._raw_body is not None or not self._takes_bytes():
                break
            parsing = self._parsing
            if parsing is not None and parsing.method and parsing.content_length is not None:
                stop = pos + parsing.content_length - parsing._size
            else:
                if cut < pos:
                    cut = data.find(HEAD_END, pos)
                stop = end if cut < 0 else cut + 4
            stop = min(stop, end)
            self._feed(view[pos:stop], pos, data)
            pos = stop
        if self._raw_body is not None:
            return b""  # _feed handed the rest to the upgrade request's body
        return data[pos:] if pos < end else b""

    def _feed(self, data: bytes | memoryview, offset: int, whole: bytes) -> None:
        """One slice into llhttp; a head that never ends and parse errors are refused here."""
        in_head = self._parsing is None or not self._parsing.method
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # taskgate speaks HTTP/1.1 only: the request is answered, then the connection ends.
            self._end(CLOSING)
            if self._raw_body is not None:
                self._feed_raw(whole[offset + upgrade.args[0] :])
            else:
                self._end(BROKEN)
        except httptools.HttpParserError as exc:
            # A limit raised in a callback arrives wrapped by httptools.
            refused = exc.__context__
            if isinstance(refused, Refused):
                self._refuse(refused.status, refused.reason)
            else:
                self._refuse(400, f"Bad request: {parse_reason(exc)}")
            return
        parsing = self._parsing
        if in_head and parsing is not None and not parsing.method and self._life < BROKEN:
            # httptools gathers a header line whole before handing it over: bound what a
            # client can make taskgate hold while it never ends one.
            self._head_bytes += len(data)
            if self._head_bytes > self._head_bound:
                self._refuse(431, "Request header fields too large")

    def _stash_more(self, data: bytes) -> None:
        if self._hold(len(data)):
            self._stash += data
        else:
            self._over_budget()
        self._update_reading()

    def _over_budget(self) -> None:
        """Bytes that do not fit the process's budget are dropped: nothing after them may be
        parsed (it would be spliced onto what came before), the request they belong to gets
        503, those complete in hand are answered, then the connection ends."""
        self._end(BROKEN)
        if self._parsing is not None:
            self._parsing._fail(Refused(503, OVER_BUDGET))

    def _feed_raw(self, data: bytes) -> None:
        """The body of an upgrade request, by its Content-Length; nothing after it is read."""
        request = self._raw_body
        assert request is not None
        assert request.content_length is not None
        left = request.content_length - request._size
        request._feed(data[:left], self._limits.max_body_bytes)
        if request._size >= request.content_length:
            self._raw_body = None
            self._parsing = None
            self._end(BROKEN)
            request._finish()
        elif request._error is None:
            self._arm(request)
        self._update_reading()

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._parsing = DownstreamRequest(self)
        self._url = b""
        self._head_bytes = 0
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_header_bytes:
            raise Refused(414, "URI too long")
        self._head_size = len(self._url)

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self._parsing
        assert request is not None
        line = len(name) + len(value) + 2
        if line > self._max_line:
            raise Refused(431, "Request header fields too large: a header line is too long")
        raw = request.raw_headers
        if len(raw) >= self._max_fields:
            raise Refused(431, "Request header fields too large: too many header fields")
        self._head_size += line + 2
        raw.append((name, value))

    def on_headers_complete(self) -> None:
        request = self._parsing
        assert request is not None
        chunked = self._judge_head(request)
        parser = self._parser
        request.path = target_path(self._url)
        request.method = parser.get_method().decode("ascii")
        request.keep_alive = parser.should_keep_alive()
        limit = self._limits.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            request._fail(too_large(limit))
        elif parser.should_upgrade() and (chunked or request.content_length):
            # taskgate ignores Upgrade (RFC 9110 7.8 lets it), but llhttp hands the bytes after
            # an upgrade request's head to the new protocol: its body is read here, by its
            # length (curl --http2 sends such requests), and the connection ends after it.
            if chunked:
                reason = "Bad request: taskgate does not switch protocols; send it without Upgrade"
                request._fail(Refused(400, reason))
            else:
                self._raw_body = request
        self._requests += 1
        most = self._limits.max_requests_per_connection
        if most is not None and self._requests >= most:
            self._end(CLOSING)  # this one is the last: its answer says Connection: close
        if self._active is None and not self._queue:
            self._active = request
            self._answer = STARTING
        else:
            # Its turn comes after the one being answered: its bytes wait, so does its timer.
            request._disarm()
            self._queue.append(request)

    def _judge_head(self, request: DownstreamRequest) -> bool:
        """Index the header fields of `request`'s head and judge its framing, its Host and its
        size (Refused if they fail); whether its body is chunked."""
        request.http10 = self._parser.get_http_version() == "1.0"
        chunked = False
        hosts = 0
        host = b""
        index = request._index
        for name, value in request.raw_headers:
            lowered = name.lower()
            values = index.get(lowered)
            if values is None:
                index[lowered] = [value]
            else:
                values.append(value)
            if lowered == b"content-length":
                request.content_length = int(value)  # llhttp checked it: digits, only one
            elif lowered == b"host":
                hosts += 1
                host = value
            elif lowered == b"expect" and value.strip().lower() == b"100-continue":
                request._continue = not request.http10  # RFC 9110 10.1.1: ignored from 1.0
            elif lowered == b"transfer-encoding":
                chunked = True
        # RFC 9112: faulty framing, answered 400 and the end of the connection, never served.
        if chunked and request.http10:
            raise Refused(400, "Bad request: Transfer-Encoding in an HTTP/1.0 request")
        if hosts > 1:
            raise Refused(400, "Bad request: more than one Host header")
        if hosts == 0 and not request.http10:
            raise Refused(400, "Bad request: an HTTP/1.1 request must carry a Host header")
        if hosts and not (KNOWN_HOSTS.get(host) or host_ok(host)):
            raise Refused(400, "Bad request: the Host header is not a host name")
        if self._head_size > self._head_bound:
            raise Refused(431, "Request header fields too large: the head is too large")
        return chunked

    def on_body(self, body: bytes) -> None:
        assert self._parsing is not None
        self._parsing._feed(body, self._limits.max_body_bytes)

    def on_message_complete(self) -> None:
        assert self._parsing is not None
        if self._parsing is not self._raw_body:  # its body is still to come
            self._parsing._finish()
            self._parsing = None
