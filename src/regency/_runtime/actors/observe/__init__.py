"""Observation helpers: the telemetry probe (`tracing`), the debugger seam (`breakpoints`),
log forwarding and log records, stack dumps, and the answers gathered from procs."""
