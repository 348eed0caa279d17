"""Inspection for the operator: `taskgate routes`, `taskgate task inspect`, GET /tasks/<id>.
Being built (issue 14)."""

from __future__ import annotations

import argparse

from aiohttp import web

from gateway.config import Config


async def task_route(request: web.Request) -> web.Response:
    raise web.HTTPNotImplemented(text="task inspection is being built (issue 14)\n")


def routes_command(config: Config, args: argparse.Namespace) -> int:
    raise NotImplementedError("being built (issue 14)")


def task_command(config: Config, args: argparse.Namespace) -> int:
    raise NotImplementedError("being built (issue 14)")
