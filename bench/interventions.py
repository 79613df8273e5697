"""Cost of the plasticity interventions (issue 3): FIRE, Continual Backprop and ReDo.

A thin wrapper around ``bench/overhead.py``: it runs the intervention entries of its registry (see that
script's docstring for the method and the table), nothing is measured here.

* ``ppo-cnn-fire``: one FIRE call on PPO CnnPolicy (Breakout) as a fraction of a 1M-step run at PPO's fps
  measured in the same run (target < 1 %);
* ``*-cbp``: fps ratio of plain SB3 with ``ContinualBackprop`` against plain SB3 (PPO CNN, DQN MLP and CNN,
  SAC MLP), interleaved A/B repetitions (target >= 0.90);
* ``*-redo``: ReDo at its default period (1000 gradient steps), projected from one check's time (PPO CNN,
  SAC MLP) or measured in place (DQN MLP).

Examples::

    python bench/interventions.py --quick        # ppo-cnn-fire, ppo-cnn-cbp (<= ~1 minute)
    python bench/interventions.py                # every intervention entry, full mode
    python bench/interventions.py --only ppo-cnn-redo --repeats 3   # any overhead.py option works
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # bench/overhead.py, next to this file

ENTRIES = (
    "ppo-cnn-fire", "ppo-cnn-cbp", "dqn-mlp-cbp", "dqn-cnn-cbp", "sac-mlp-cbp", "ppo-cnn-redo", "dqn-mlp-redo", "sac-mlp-redo",
)
QUICK_ENTRIES = ("ppo-cnn-fire", "ppo-cnn-cbp")


def with_entries(argv: list[str], entries: tuple[str, ...], quick_entries: tuple[str, ...]) -> list[str]:
    """``argv`` plus ``--only`` for each of the entries (the quick ones with ``--quick``) unless it names its own."""
    if "--list" in argv or any(a == "--only" or a.startswith("--only=") for a in argv):
        return argv
    names = quick_entries if "--quick" in argv else entries
    return argv + [arg for name in names for arg in ("--only", name)]


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return overhead.main(with_entries(argv, ENTRIES, QUICK_ENTRIES))


if __name__ == "__main__":
    sys.exit(main())
