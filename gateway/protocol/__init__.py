"""Sans-IO MCP 2026-07-28 core, and which era a request is of (era.py): plain functions and
frozen values; no I/O, no project imports."""
