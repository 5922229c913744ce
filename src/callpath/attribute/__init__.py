"""Attribution (``callpath prof``): join measured call paths with recovered structure, merge
every execution context into one calling context tree, and compute the propagated metrics and
summary statistics of a v4 database."""
