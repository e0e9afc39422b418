"""What a chain reports: per-tier counters and latency, Prometheus and log lines.

May import :mod:`kvtier.config` and :mod:`kvtier.spec`.
"""
