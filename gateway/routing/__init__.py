"""Which backend serves a tool, and which replica takes the call (docs/architecture.md, step 7)."""
