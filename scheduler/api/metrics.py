"""API metrics (bounded labels: route template, method, status class)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter("fencepost_api_requests_total", "HTTP API requests", ["route", "method", "status"])
LATENCY = Histogram("fencepost_api_request_seconds", "HTTP API request duration", ["route"],
                    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
REFUSED = Counter("fencepost_api_refused_total", "Requests refused before acting (auth, limits, bad input)",
                  ["reason"])
