"""The operator's tools: the admin listener and its status page, reload, inspect, readiness,
the /metrics exposition and, with --workers, the loop that publishes to the workers' board."""
