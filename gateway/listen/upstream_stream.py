"""One upstream listen's stream, as every leg of taskgate's own opens it (a downstream listen's
tasks and resources, gateway/listen/upstream_leg.py; a replica's lists,
gateway/listen/list_listens.py): POSTed, refused unless it is an event stream, acknowledged
within `ack_timeout_s`, then read until the upstream ends it or sends the listen's result.
What each notification means is the leg's (`heard`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.listen.upstream_wire import sse_message
from gateway.protocol.sse import FrameTooLarge, SSEDecoder
from gateway.upstream.connection import UpstreamResponse
from gateway.upstream.framing import ExchangeError
from gateway.upstream.pool import Pool
from gateway.upstream.relay import EVENT_STREAM, header_lines, send
from gateway.upstream.replicas import Replica

log = logging.getLogger("taskgate.listen")

_MAX_REFUSAL_BYTES = 64 * 1024  # of a refusal's body, read for the log

# A notification of the stream, with the acknowledgement's deadline (rescheduled to none once
# acknowledged); True when the leg has nothing left to relay.
Heard = Callable[[dict[str, Any], asyncio.Timeout], Awaitable[bool]]


class StreamOwner(Protocol):
    """What a stream takes of the process's upstream listens of its kind."""

    ack_timeout_s: float
    streams: int  # upstream listen answers open now
    pool: Pool  # the process's connections to replicas, the relay's too


async def listen_stream(
    owner: StreamOwner,
    replica: Replica,
    request: tuple[bytes, dict[str, str]],
    request_id: str,
    max_frame: int,
    heard: Heard,
    what: str,
) -> None:
    """POST the listen `request` (body, headers) to `replica` and read its stream to the end;
    every failure is logged (`what` names the listen) and ends it: the leg decides whether
    and when to listen again. The POST goes as the relay's do (relay.send), with no deadline
    on the connection: a listen lasts until the upstream or the leg ends it."""
    body, headers = request
    opened = False
    try:
        async with asyncio.timeout(owner.ack_timeout_s) as deadline:
            response = await send(
                owner.pool, replica, request_id, body, header_lines(headers), None, False
            )
            try:
                owner.streams += 1
                opened = True
                if not await _refused(response, replica, what):
                    await _read(response, request_id, deadline, max_frame, heard)
            finally:
                response.close()  # harmless when read to its end; else the upstream sees it
    except GatewayError as failed:
        log.debug("%s at %s: %s", what, replica.label, failed.message)
    except (TimeoutError, OSError, ExchangeError, FrameTooLarge) as exc:
        log.debug("%s at %s: %s", what, replica.label, type(exc).__name__)
    except Exception:
        log.exception("%s at %s failed", what, replica.label)
    finally:
        if opened:
            owner.streams -= 1


async def _refused(response: UpstreamResponse, replica: Replica, what: str) -> bool:
    """Whether the replica refused the listen (anything but an event stream), logged."""
    content_type = (response.header(b"content-type") or "").partition(";")[0]
    if response.status == 200 and content_type.strip().lower() == EVENT_STREAM:
        return False
    refusal = b""
    # A refusal larger than that, or broken: its status says enough.
    with contextlib.suppress(ExchangeError):
        refusal = await response.read(_MAX_REFUSAL_BYTES)
    log.debug("%s at %s refused (HTTP %d): %r", what, replica.label, response.status, refusal[:200])
    return True


async def _read(
    response: UpstreamResponse,
    request_id: str,
    deadline: asyncio.Timeout,
    max_frame: int,
    heard: Heard,
) -> None:
    """The stream's events until the upstream ends it, sends the listen's result (or an error
    before the acknowledgement), or `heard` says the leg is done."""
    decoder = SSEDecoder(max_frame)
    async for chunk in response.chunks():
        for frame in decoder.feed(chunk):
            message = sse_message(frame.data)
            if message is None:
                continue  # a comment (`: ping`) or not a JSON-RPC message
            if "method" not in message:
                if message.get("id") == request_id:
                    return  # the listen's result, or an error before the ack
                continue
            if await heard(message, deadline):
                return
