"""laneway.simulator."""
