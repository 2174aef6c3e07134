"""laneway.operator."""
