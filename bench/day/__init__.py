"""`laneway bench day`: a compressed day of chat and a Batches backlog on one cluster, under
the configurations that share it differently, lending whole replicas among them."""
