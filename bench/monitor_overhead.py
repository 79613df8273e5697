"""Overhead of the PlasticityMonitor (issue 5).

A thin wrapper around ``bench/overhead.py``: it runs the monitor entries of its registry (see that script's
docstring for the method and the table), nothing is measured here.

* ``ppo-cnn-monitor`` / ``sac-mlp-monitor``: the time of one diagnostics pass on PPO CnnPolicy (Breakout) /
  SAC MlpPolicy (Pendulum), projected to the monitor's defaults (a pass every ``DEFAULT_EVERY`` = 5000 env steps,
  ``max_overhead=0.02``) at the fps measured in the same run: the projected fps ratio with the default cap
  (target >= 0.95) and without it;
* ``dqn-mlp-monitor``: DQN MLP (CartPole) with the monitor in place, one pass per repetition (every 4096 env
  steps, no cap) against DQN, interleaved A/B repetitions (target >= 0.95).

Examples::

    python bench/monitor_overhead.py --quick     # ppo-cnn-monitor (<= ~1 minute)
    python bench/monitor_overhead.py             # the three monitor entries, full mode
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # bench/overhead.py, next to this file
from interventions import with_entries

ENTRIES = ("ppo-cnn-monitor", "dqn-mlp-monitor", "sac-mlp-monitor")
QUICK_ENTRIES = ("ppo-cnn-monitor",)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return overhead.main(with_entries(argv, ENTRIES, QUICK_ENTRIES))


if __name__ == "__main__":
    sys.exit(main())
