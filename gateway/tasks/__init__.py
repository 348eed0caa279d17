"""Tasks: recording the durable route of a backend's task before its id is answered, and the
lookup and ownership check of every later task method."""
