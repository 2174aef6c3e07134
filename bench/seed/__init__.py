"""`laneway bench seed`: the seed experiment, in virtual time or live, its sweep, table and plot."""
