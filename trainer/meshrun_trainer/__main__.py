"""``python -m meshrun_trainer``: one trainer process (run under torchrun)."""

import logging
import os
import sys

from meshrun_trainer.main import main

code = main()
# The process groups are destroyed and every file is closed; what is left is the interpreter's
# own teardown, in which gloo's threads can abort a rank that trained to the end ("terminate
# called without an active exception", SIGABRT, in a thread with no Python frame): the suite saw
# it in test launches after their work, and once in a two-rank local run, whose rank then counts
# as failed, as a pod would. So the rank flushes what it wrote and leaves without that teardown.
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
