"""The durable stores: the task-route table (which replica owns a task, and who owns it) and the
2025-era sessions, each its own class, both on one connection per process (Redis: RedisLink;
SQLite: SQLiteDatabase)."""
