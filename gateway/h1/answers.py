"""The process-wide budget of answer bytes held for downstream clients, one account per connection.

What it bounds: bytes of answers read from replicas for a client and not yet handed to the
kernel, i.e. what the relay holds for the request being answered (the upstream connection's
buffer, a JSON body read whole, an event being decoded) plus what the client's transport has
not sent yet. Without it, a client that asks for large answers and never reads them keeps each
one in taskgate's memory until its connection is cut, and answers read whole for many requests
at once are each as large as a replica may make them.

The rule, checked after each read from a replica (the bytes are in memory by then; the rule
decides whether to read more):

1. while the total held is at most `limit`, any connection reads on;
2. past it, a connection reads on while its own account is at most `reserve`, which is
   `limit / max_connections`: every connection may hold that much whatever the others hold,
   so that small answers are never held up by clients that do not read;
3. past it, one connection at a time reads on beyond its reserve: the first to meet the limit,
   then, once its account is back within its reserve (its client read the answer, or left),
   the one that has waited longest. Without this, answers read whole at once could each wait
   for the others to finish, and none would before its deadline;
4. any other connection's upstream read pauses (the replica's socket buffers hold the rest,
   not taskgate) until the budget lets it go on, within the request's deadline.

The bound: the accounts hold at most 2 x `limit` + one answer, plus the read that crossed the
line for each request reading. Split each account into its part up to `reserve` and its excess.
The reserved parts sum to at most max_connections x reserve = `limit` (rule 2). Outside rule 3,
an excess grows only by reads made while the total was at most `limit` (rule 1), so those
excesses sum to at most `limit`; rule 3 adds one account's excess, which its answer bounds (a
JSON answer's max_answer_bytes; a stream's read-ahead and one event). A fair share of
`limit / k` among the k connections holding bytes, the obvious alternative, bounds nothing:
connections that come one by one each take `limit / k` of a growing k, and those shares sum as
the harmonic series does (`limit` x 9.8 for 10,000 connections).

Cheap when under budget: one read is two additions and two comparisons; an answer written to a
client is one more call. Plain classes, for mypyc; nothing here allocates on those paths.
"""

from __future__ import annotations

from collections.abc import Callable


class AnswerBudget:
    """Answer bytes held for clients over all connections of a process; see the module."""

    __slots__ = ("_waiting", "beyond", "held", "limit", "reserve")

    def __init__(self, limit: int, max_connections: int) -> None:
        self.limit = limit
        self.reserve = limit // max(max_connections, 1)
        self.held = 0
        # The one account reading beyond its reserve past the limit (rule 3), if any.
        self.beyond: AnswerAccount | None = None
        # Accounts whose upstream read paused, each with the call that resumes it; a dict as
        # an ordered set, so that the one that waited longest goes first.
        self._waiting: dict[AnswerAccount, Callable[[], None]] = {}

    def account(self) -> AnswerAccount:
        """A connection's account, empty."""
        return AnswerAccount(self)

    @property
    def waiting(self) -> int:
        """Upstream reads paused for the budget now."""
        return len(self._waiting)

    def _released(self, account: AnswerAccount) -> None:
        """`account` let bytes go (or its connection was lost) while reads wait or it read
        beyond its reserve: wake the reads the rule lets go on now. Each woken read reads once
        more and is judged again."""
        if self.beyond is account and account.reading + account.unsent <= self.reserve:
            self.beyond = None
        waiting = self._waiting
        if not waiting:
            return
        if self.held <= self.limit:
            self._waiting = {}
            for resume in waiting.values():
                resume()
            return
        if account.reading + account.unsent <= self.reserve and account in waiting:
            waiting.pop(account)()
        if self.beyond is None and waiting:
            first = next(iter(waiting))
            self.beyond = first
            waiting.pop(first)()


class AnswerAccount:
    """The answer bytes one downstream connection holds: `reading`, held by the relay for the
    request being answered, and `unsent`, what its transport had not sent when last looked at
    (after each write, on resume_writing). All of it is let go when the connection is lost."""

    __slots__ = ("_budget", "closed", "reading", "unsent")

    def __init__(self, budget: AnswerBudget) -> None:
        self._budget = budget
        self.reading = 0
        self.unsent = 0
        self.closed = False  # the connection is gone: nothing is counted any more

    @property
    def held(self) -> int:
        return self.reading + self.unsent

    def read(self, size: int) -> bool:
        """Count `size` bytes just read from a replica for this connection; whether more may
        be read now (if not, the caller pauses its read and calls `wait`)."""
        if self.closed:
            return True  # the request dies with its connection, and its bytes with it
        self.reading += size
        budget = self._budget
        budget.held += size
        if budget.held <= budget.limit or self.reading + self.unsent <= budget.reserve:
            return True
        if budget.beyond is None:
            budget.beyond = self
        return budget.beyond is self

    def wait(self, resume: Callable[[], None]) -> None:
        """The read paused: `resume` is called once, when the budget lets it go on."""
        if not self.closed:
            self._budget._waiting[self] = resume

    def unwait(self) -> None:
        """The paused read ended otherwise (its answer failed, its deadline passed)."""
        self._budget._waiting.pop(self, None)

    def let_go(self, size: int) -> None:
        """`size` bytes of the answer being read went to the client's transport (`sent`
        counts them there)."""
        if self.closed:
            return
        self.reading -= size
        budget = self._budget
        budget.held -= size
        if budget._waiting or budget.beyond is self:
            budget._released(self)

    def sent(self, unsent: int) -> None:
        """The transport's unsent bytes, looked at now."""
        if self.closed:
            return
        change = unsent - self.unsent
        if change:
            self.unsent = unsent
            budget = self._budget
            budget.held += change
            if change < 0 and (budget._waiting or budget.beyond is self):
                budget._released(self)

    def answered(self, unsent: int) -> None:
        """The request's answer was written, or the request ended without it: the relay holds
        nothing more of it, and the transport holds `unsent`."""
        if self.closed:
            return
        change = unsent - self.unsent - self.reading
        self.reading = 0
        self.unsent = unsent
        budget = self._budget
        budget.held += change
        if change < 0 and (budget._waiting or budget.beyond is self):
            budget._released(self)

    def close(self) -> None:
        """The connection is gone: everything it held is let go, and nothing more counts."""
        if self.closed:
            return
        budget = self._budget
        budget._waiting.pop(self, None)
        budget.held -= self.reading + self.unsent
        self.reading = self.unsent = 0
        self.closed = True
        if budget._waiting or budget.beyond is self:
            budget._released(self)
