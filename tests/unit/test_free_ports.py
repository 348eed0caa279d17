"""The ports tests hand to processes that must be told a number (tests/support/procs.py,
free_ports): free when given, below the kernel's ephemeral range (where no client connection
of another test can take one first), in this worker's own slice, and not given twice in a row."""

from __future__ import annotations

import socket

import pytest

from tests.support import procs
from tests.support.procs import LOOPBACK, _ephemeral_start, _recent, _slice, free_ports


def test_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(port in _slice() and port < _ephemeral_start() for port in ports)
    for port in ports:  # each can be listened on now
        with socket.socket() as sock:
            sock.bind((LOOPBACK, port))
            sock.listen()


def test_a_port_is_not_handed_out_again_by_the_next_calls() -> None:
    given = [port for _ in range(50) for port in free_ports(2)]
    assert len(set(given)) == len(given)


def test_a_port_some_socket_holds_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three ports this process never handed out, the first held by a listener: asked for two,
    # only the bind can tell which.
    three = next(
        range(port, port + 3)
        for port in _slice()
        if not any(p in _recent for p in range(port, port + 3)) and port + 3 <= _slice().stop
    )
    monkeypatch.setattr(procs, "_slice", lambda: three)
    with socket.socket() as taken:
        taken.bind((LOOPBACK, three[0]))
        taken.listen()
        assert sorted(free_ports(2)) == [three[1], three[2]]
