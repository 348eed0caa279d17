"""The process: the command line, the wiring of one taskgate (app), serving it (serve), the
--workers supervisor, and the demo."""
