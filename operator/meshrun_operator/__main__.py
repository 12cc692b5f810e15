"""``python -m meshrun_operator``: the same as ``meshrun operator``."""

import sys

# The operator talks to the API server itself (rest.py). kopf imports the kubernetes client
# whenever it is installed (a development environment has it; the operator image does not), only
# to recognise the client's model objects, which the operator never hands it: a fifth of the
# operator's memory for nothing. Importing it is refused here, before kopf is imported.
sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]

from meshrun_operator.main import main  # noqa: E402

sys.exit(main())
