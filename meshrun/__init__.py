"""meshrun: the shared core (API types, planner, CLI) of the meshrun operator."""
