"""`taskgate reload --config FILE`: asks the admin listener that FILE names to reload, and
prints what it answered."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

from gateway.config import Config
from gateway.ops.admin_client import admin_base, admin_headers


def reload_command(config: Config, args: argparse.Namespace) -> int:
    """`taskgate reload --config FILE`: POST /reload to the admin listener FILE names; print
    what changed (exit 0) or each problem (exit 1)."""
    admin = config.admin
    if admin is None:
        print(
            f"taskgate: {args.config} has no admin section: `taskgate reload` asks the admin "
            "listener; send SIGHUP to the taskgate process instead",
            file=sys.stderr,
        )
        return 1
    base = admin_base(admin)
    if base is None:
        print(
            f"taskgate: {args.config} says admin.port: 0 (a port picked at start): "
            "`taskgate reload` cannot find it; send SIGHUP instead",
            file=sys.stderr,
        )
        return 1
    url = f"{base}/reload"
    headers = admin_headers(admin)
    # No proxy: the admin listener is this machine's (or the operator's own network's).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    post = urllib.request.Request(url, data=b"", headers=headers, method="POST")
    try:
        with opener.open(post, timeout=args.timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as refused:
        status, raw = refused.code, refused.read()
    except (urllib.error.URLError, OSError) as failure:
        reason = getattr(failure, "reason", failure)
        print(
            f"taskgate: nothing answers at {url} ({reason}): is taskgate running with this "
            "admin section?",
            file=sys.stderr,
        )
        return 1
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or "applied" not in answer:
        text = raw.decode(errors="replace").strip()
        print(f"taskgate: the admin listener answered {status}: {text}", file=sys.stderr)
        return 1
    if answer["applied"]:
        print(f"taskgate: reloaded {args.config} (version {answer['version']})")
        for change in answer.get("changes", []):
            print(f"  {change}")
        if answer.get("workers_signalled"):
            print("  the other workers were asked to reload the same file (each logs its outcome)")
        return 0
    print(
        f"taskgate: {args.config} was not applied; taskgate keeps running version "
        f"{answer['version']}:",
        file=sys.stderr,
    )
    for problem in answer.get("problems", []):
        print(f"  {problem}", file=sys.stderr)
    return 1
