"""Reload without restart (SIGHUP, POST /reload, `taskgate reload`). Being built (issue 14)."""

from __future__ import annotations

import argparse

from aiohttp import web

from gateway.config import Config
from gateway.observe.history import Reload
from gateway.state import Gateway


class Reloader:
    def __init__(self, state: Gateway, path: str) -> None:
        self.state = state
        self.path = path

    async def reload(self, trigger: str) -> Reload:
        raise NotImplementedError("reload is being built (issue 14)")


RELOADER = web.AppKey("reloader", Reloader)  # absent: not started from a file


async def reload_endpoint(request: web.Request) -> web.Response:
    raise web.HTTPNotImplemented(text="reload is being built (issue 14)\n")


def reload_command(config: Config, args: argparse.Namespace) -> int:
    raise NotImplementedError("being built (issue 14)")
