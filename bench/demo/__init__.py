"""`laneway demo`: simulated pools and the gateway here, a mixed workload, a live table."""
