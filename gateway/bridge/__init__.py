"""Backends of the 2025 era: which era each replica speaks (learned or configured), and
taskgate's own 2025-era sessions on those that speak nothing newer."""
