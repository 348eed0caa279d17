"""An answer's body between the replica's socket and the caller: what arrived and was not taken
yet, and whether more is read. Reading pauses while a streamed body's backlog is above
HIGH_WATER, or while the answer budget (gateway/h1/answers.py) says no, so that a slow client
holds back the replica instead of filling taskgate's memory."""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.h1.answers import AnswerAccount

# Streamed bodies (SSE) stop reading from the socket above HIGH and resume below LOW.
HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024


class Backlog:
    """The body of one connection's current answer, received and not yet taken.

    Two independent reasons pause reading, one flag each, apart from the exchange's life
    (either may hold, or both, in any part of a body): `backlogged`, a streamed body's backlog
    passed HIGH_WATER; `starved`, the answer budget said no for now. Reading resumes once
    neither holds."""

    __slots__ = (
        "_resume_for_budget",
        "account",
        "backlogged",
        "bounded",
        "chunks",
        "received",
        "size",
        "starved",
        "transport",
    )

    def __init__(self) -> None:
        # The connection's transport while it is open: a closed one is neither paused nor
        # resumed (Connection.close lets go of it).
        self.transport: asyncio.Transport | None = None
        self.starved = False
        # The client connection's account the answer is charged to (UpstreamResponse.charge).
        self.account: AnswerAccount | None = None
        # Made once: the budget calls it to resume a read it paused, and compares it.
        self._resume_for_budget = self._resume_after_budget
        self.reset()

    def reset(self) -> None:
        """A new exchange: nothing of the last answer counts or is kept."""
        self.detach()
        self.chunks: deque[bytes] = deque()
        self.size = 0  # the bytes in `chunks`
        self.received = 0  # body bytes received in all
        self.bounded = True  # streamed: reading pauses above HIGH_WATER
        self.backlogged = False

    def add(self, body: bytes) -> None:
        """A piece of the body arrived; reading pauses past HIGH_WATER while streamed, and
        when the answer budget says no."""
        self.chunks.append(body)
        self.received += len(body)
        self.size += len(body)
        if self.bounded and not self.backlogged and self.size > HIGH_WATER and self.transport:
            self.backlogged = True
            if not self.starved:
                self.transport.pause_reading()
        account = self.account
        if account is not None and not account.read(len(body)):
            self._starve(account)

    def take(self) -> bytes | None:
        """The next chunk received, or None; reading resumes once the backlog is low."""
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.size -= len(chunk)
        if self.backlogged and self.size < LOW_WATER and self.transport:
            self.backlogged = False
            if not self.starved:
                self.transport.resume_reading()
        return chunk

    def unbound(self) -> None:
        """The body is read whole: the caller's limit bounds memory instead of back-pressure,
        which would stall."""
        self.bounded = False
        if self.backlogged and self.transport is not None:
            self.backlogged = False
            if not self.starved:
                self.transport.resume_reading()

    def charge(self, account: AnswerAccount) -> None:
        self.account = account
        if self.size and not account.read(self.size):
            self._starve(account)

    def clear(self) -> None:
        """Drop what is kept of the answer now (Connection._let_go says why)."""
        self.detach()
        self.chunks.clear()
        self.size = 0

    def _starve(self, account: AnswerAccount) -> None:
        """The answer budget says no more for now: stop reading from the replica until it
        calls back (the deadline still runs)."""
        if not self.starved:
            self.starved = True
            if not self.backlogged and self.transport is not None:
                self.transport.pause_reading()
            account.wait(self._resume_for_budget)

    def _resume_after_budget(self) -> None:
        if self.starved:
            self.starved = False
            if not self.backlogged and self.transport is not None:
                self.transport.resume_reading()

    def detach(self) -> None:
        """No more of this answer counts against the budget (what was counted is let go with
        the client's request); a read it paused resumes, for the connection's next answer."""
        account = self.account
        if account is not None:
            self.account = None
            if self.starved:
                account.unwait()
                self._resume_after_budget()
