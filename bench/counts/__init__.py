"""`laneway bench counts`: the gateway's default token count against a model's own, near edges."""
