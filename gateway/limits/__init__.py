"""Fair shares between tenants (the `limits` section; docs/limits.md): the policy resolved per
tenant (policy.py), the limiter every request asks (limiter.py), the snapshots that keep
tasks/get to its pollIntervalMs (polling.py), and what the in-flight table applies
(concurrency.py)."""
