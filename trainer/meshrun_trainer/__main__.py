"""``python -m meshrun_trainer``: one trainer process (run under torchrun)."""

import sys

from meshrun_trainer.main import main

sys.exit(main())
