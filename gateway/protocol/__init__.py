"""Sans-IO MCP 2026-07-28 core: plain functions and frozen values; no I/O, no project imports."""
