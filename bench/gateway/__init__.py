"""`laneway bench gateway`: the gateway's own cost, direct against through it, and beside peers."""
