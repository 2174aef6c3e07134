"""`laneway bench redis`: what the Redis state layer costs per request, against in-memory."""
