"""Control: bench/continual.py with the per-element Adam restart switched off (everything else as the current tree)."""
import runpy
import sys

import sb3_plastic.optim as optim

optim.supports_restart = lambda optimizer: False  # reset_optimizer_state then only zeroes the moments (the old behaviour)
sys.argv = ["bench/continual.py", *sys.argv[1:]]
runpy.run_path("bench/continual.py", run_name="__main__")
