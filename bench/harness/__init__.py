"""What every benchmark shares: the load generator, child processes, a live cluster, flags."""
