"""Microbenchmarks (pytest-benchmark) of the request hot path; not part of the CI suite.

.venv/bin/pytest bench/micro -p no:cacheprovider --benchmark-columns=min,median,mean,ops -q
"""
