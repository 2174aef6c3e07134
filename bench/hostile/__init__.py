"""`laneway bench hostile`: /healthz latency while hostile request bodies arrive."""
