"""`laneway bench autoscale`: static peak-sized pools against elastic ones, and the sweep."""
