"""The durable task-route table: which replica owns a task, and who owns it."""
