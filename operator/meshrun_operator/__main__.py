"""``python -m meshrun_operator``: the same as ``meshrun operator``."""

import sys

from meshrun_operator.process import main

sys.exit(main())
