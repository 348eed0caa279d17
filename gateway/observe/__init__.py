"""What an operator sees of a running taskgate: per-request records, Prometheus metrics, request
logs, traces and the recent failures the status page lists (docs/operations.md)."""
