"""The public listener: aiohttp's low-level server, one dispatch on path and method.

An aiohttp Application would add a router, a Request with match info and signals on every
request: about 10 us of CPU a request on the benchmark machine (docs/performance.md), for a
listener that serves one path. The low-level server keeps aiohttp's HTTP parsing, keep-alive,
limits and drain, and hands each request to `dispatch`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from gateway.auth import metadata
from gateway.config import Config
from gateway.errors import error_body
from gateway.handler import handle_post, method_not_allowed
from gateway.protocol.codes import Code
from gateway.state import Gateway

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
JSON = "application/json"


def public_server(config: Config, gateway: Gateway) -> web.Server:
    """The server of `config.listen`, with its header and body limits, handlers cancelled when
    their client disconnects (which closes the upstream request), and no access log."""
    listen = config.listen
    return _PublicServer(
        dispatcher(config, gateway),
        max_body_bytes=listen.max_body_bytes,
        handler_cancellation=True,
        access_log=None,
        max_line_size=listen.max_header_bytes,
        max_field_size=listen.max_header_bytes,
        max_headers=listen.max_headers,
    )


def dispatcher(config: Config, gateway: Gateway) -> Handler:
    """POST on the MCP path is the pipeline; any other method there is 405 (after auth);
    RFC 9728 metadata at its well-known paths; anything else 404."""
    path = config.listen.path
    documents: dict[str, bytes] = {}
    if config.auth.mode == "jwt":
        # RFC 9728: the root document and the one for the MCP path, public like the key set.
        document = orjson.dumps(metadata.document(config.auth))
        for well_known in (metadata.WELL_KNOWN, metadata.WELL_KNOWN + path.rstrip("/")):
            documents[well_known] = document
    not_found = error_body(None, Code.INVALID_REQUEST, f"Not found: taskgate serves MCP at {path}")

    async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
        if request.path == path:
            if request.method == "POST":
                return await handle_post(gateway, request)
            return await method_not_allowed(gateway, request)
        document = documents.get(request.path)
        if document is not None and request.method in ("GET", "HEAD"):
            return web.Response(body=document, content_type=JSON)
        return web.Response(status=404, body=not_found, content_type=JSON)

    return dispatch


class _JSONErrorHandler(RequestHandler):
    """aiohttp answers what its HTTP parser refuses (header too long, too many headers, a
    broken request line) in plain text; taskgate's clients get a JSON-RPC error body too."""

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        response = super().handle_error(request, status, exc, message)
        if isinstance(response, web.Response):
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = f"HTTP {status}"
            reason = f"{phrase}: {type(exc).__name__}" if exc is not None else phrase
            code = Code.INTERNAL_ERROR if status >= 500 else Code.INVALID_REQUEST
            response.body = error_body(None, code, reason)
            response.content_type = JSON
        return response


class _PublicServer(web.Server):
    """A low-level server whose requests carry the body limit and whose connections answer
    parser errors with JSON-RPC bodies."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._max_body_bytes = max_body_bytes

    def _make_request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        # aiohttp's own body limit is a backstop; the handler answers 413 with a JSON-RPC body.
        return web.BaseRequest(
            message,
            payload,
            protocol,
            writer,
            task,
            self._loop,
            client_max_size=self._max_body_bytes,
        )

    def __call__(self) -> RequestHandler:
        return _JSONErrorHandler(self, loop=self._loop, **self._kwargs)
