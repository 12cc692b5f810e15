"""``python -m meshrun_trainer``: one trainer process (run under torchrun)."""

from meshrun_trainer.distributed.mesh import leave
from meshrun_trainer.main import main

leave(main())  # after main() destroyed the process groups and closed its files
