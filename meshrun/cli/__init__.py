"""``meshrun``: the command line and the renderers of a plan (text and picture)."""
