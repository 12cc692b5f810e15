"""kopf wiring and the loop: handlers, context, reconcile, resync, leader election, Kueue."""
