"""laneway.gateway."""
