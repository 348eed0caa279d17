"""One upstream listen's stream, as every leg of taskgate's own opens it (a downstream listen's
tasks and resources, gateway/listen/upstream_leg.py; a replica's lists,
gateway/listen/list_listens.py): POSTed, refused unless it is an event stream, acknowledged
within `ack_timeout_s`, then read until the upstream ends it or sends the listen's result.
What each notification means is the leg's (`heard`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp

from gateway.listen.upstream_wire import sse_message
from gateway.protocol.sse import FrameTooLarge, SSEDecoder
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

    def session(self) -> aiohttp.ClientSession: ...


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
    and when to listen again."""
    body, headers = request
    opened = False
    try:
        async with (
            asyncio.timeout(owner.ack_timeout_s) as deadline,
            owner.session().post(
                replica.url, data=body, headers=headers, allow_redirects=False
            ) as response,
        ):
            owner.streams += 1
            opened = True
            if not await _refused(response, replica, what):
                await _read(response, request_id, deadline, max_frame, heard)
    except (TimeoutError, OSError, aiohttp.ClientError, FrameTooLarge) as exc:
        log.debug("%s at %s: %s", what, replica.label, type(exc).__name__)
    except Exception:
        log.exception("%s at %s failed", what, replica.label)
    finally:
        if opened:
            owner.streams -= 1


async def _refused(response: aiohttp.ClientResponse, replica: Replica, what: str) -> bool:
    """Whether the replica refused the listen (anything but an event stream), logged."""
    content_type = response.headers.get("Content-Type", "").partition(";")[0]
    if response.status == 200 and content_type.strip() == "text/event-stream":
        return False
    refusal = await response.content.read(_MAX_REFUSAL_BYTES)
    log.debug("%s at %s refused (HTTP %d): %r", what, replica.label, response.status, refusal[:200])
    return True


async def _read(
    response: aiohttp.ClientResponse,
    request_id: str,
    deadline: asyncio.Timeout,
    max_frame: int,
    heard: Heard,
) -> None:
    """The stream's events until the upstream ends it, sends the listen's result (or an error
    before the acknowledgement), or `heard` says the leg is done."""
    decoder = SSEDecoder(max_frame)
    while True:
        chunk = await response.content.readany()
        if not chunk:
            return  # the upstream ended its stream
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
