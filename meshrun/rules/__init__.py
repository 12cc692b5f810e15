"""The rules a spec must follow, shared by the planner, the operator and the trainer."""
