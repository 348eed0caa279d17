"""taskgate's own log lines (startup, warnings, reloads), in the format of its request log:
text with UTC times, or one JSON object per line (`logging.format: json`)."""

from __future__ import annotations

import logging
import time

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"


class JSONFormatter(logging.Formatter):
    """time, level, logger, pid and message; the traceback as `exception` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure(level: str, *, json: bool) -> None:
    """The root logger's one handler, on standard error; UTC times in both formats, as the
    request log has them."""
    formatter: logging.Formatter
    if json:
        formatter = JSONFormatter()
    else:
        formatter = logging.Formatter(TEXT_FORMAT)
        formatter.converter = time.gmtime
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
