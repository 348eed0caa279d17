"""Step 4: which backend serves a tool, and which replica of it takes the call."""
