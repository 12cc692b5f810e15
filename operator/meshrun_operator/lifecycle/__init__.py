"""The pure decision: from a job and what is seen, the new status and the side effects to take."""
