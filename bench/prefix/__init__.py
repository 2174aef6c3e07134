"""`laneway bench prefix`: prefix-cache affinity against none and a sticky oracle."""
