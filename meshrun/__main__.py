"""``python -m meshrun``: the same as the ``meshrun`` command."""

import sys

from meshrun.cli.main import main

sys.exit(main())
