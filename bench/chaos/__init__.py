"""`laneway bench chaos`: mixed load through two gateway replicas while faults strike."""
