"""The upstream side: replicas and their health, the one upstream attempt both pipelines make
(attempt.py), taskgate's HTTP/1.1 client connections and their pool, the relay of one request,
and taskgate's own calls (discovery, probes, cancels)."""
