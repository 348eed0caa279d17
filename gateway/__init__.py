"""taskgate: an MCP 2026-07-28 gateway that routes the Tasks extension across replicas."""

__version__ = "0.1.0"
