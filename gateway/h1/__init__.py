"""taskgate's own HTTP/1.1 server over llhttp (httptools): the public listener's framing, flow
control and limits, and the process-wide budget of answers held in memory (answers.py)."""
