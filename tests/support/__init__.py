"""Helpers shared by the test suites: real processes and raw MCP requests."""
