"""Demo MCP backends the gateway routes to in tests and in `make demo`."""
