"""A failure of the running attempt, from the pods to the verdict: ``detect.py`` finds the first
one (a deleted pod, a lost node, a failed or stuck pod), ``classes.py`` classifies it (the table
of exit codes and reasons: a new failure class goes there), and ``policy.py`` applies the job's
podFailurePolicy to the class."""
