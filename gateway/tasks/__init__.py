"""Tasks: recording the durable route of a backend's task before its id is answered, the lookup
and ownership check of every later task method (routes.py), and opening the configured store
(stores.py). Where the tasks taskgate runs itself, for servers without tasks, will live."""
