"""``meshrun run FILE --local`` and its helpers: one machine, the same trainer as in the cluster."""
