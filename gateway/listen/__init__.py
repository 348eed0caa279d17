"""subscriptions/listen through taskgate: one stream per listen request, fed by what taskgate
emulates (task snapshots polled from the owner, list changes diffed from the catalogue) and by
what backends push (gateway/listen/upstream.py). docs/architecture.md, "Listen streams"."""
