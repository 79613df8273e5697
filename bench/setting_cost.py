"""CPU cost of one run of bench/continual.py's settings, measured on a short piece and extrapolated to a full run.

Each (setting, method) trains one continual run of one task of ``--steps`` env steps (the setting's own agent,
callbacks, PlasticityMonitor every ``--monitor-every`` steps, task recorder), in this process, one torch thread, and
reads its CPU time (``time.process_time`` of the run, as the run JSON records it) and the monitor's own time (its
``plasticity/monitor_seconds`` TensorBoard key; wall time of the passes, an upper bound of their CPU time on a
shared core). A full run of the setting is estimated as ``(cpu - monitor) x total_timesteps / steps`` plus the
monitor's mean pass time for each pass a full run makes (``total_timesteps // monitor_every + 1``). Agents that learn
change their episode lengths, and so the cost of env resets, within a run: a piece from the start of task 0 is what
this measures.

Example (issue #29's Gym-control settings; bench/README.md, "Continual Gym control")::

    OMP_NUM_THREADS=1 nice -n 10 python bench/setting_cost.py --settings cchain_cartpole cchain_acrobot cchain_lunar
    python bench/setting_cost.py --settings cchain_cartpole --methods ppo ppo_trac ppo_cchain --steps 16000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import continual


def monitor_seconds(events_dir: str) -> tuple[float, int]:
    """``(seconds, passes)`` of the PlasticityMonitor of a run from its TensorBoard events: the last
    ``plasticity/monitor_seconds`` value and the number of passes (values of ``plasticity/<network>/ntk_cond``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    if "plasticity/monitor_seconds" not in tags:
        return 0.0, 0
    passes = max((len(events.Scalars(t)) for t in tags if t.endswith("/ntk_cond") and t.count("/") == 2), default=0)
    return float(events.Scalars("plasticity/monitor_seconds")[-1].value), passes


def measure(name: str, method: str, steps: int, monitor_every: int, out: str) -> dict[str, Any]:
    """Train the piece of ``method`` on setting ``name`` and return its timings and the extrapolated full run."""
    full = continual.SETTINGS[name]
    piece = replace(full, tasks=1, change_every=steps, monitor_every=monitor_every)
    record = continual.run_one(method, 0, piece, continual.MethodParams(), out, "cpu", 1)
    seconds, passes = monitor_seconds(str(Path(out, "tb", method, "s0_1")))
    per_pass = seconds / passes if passes else 0.0
    train = record["cpu_seconds"] - seconds
    full_passes = full.total_timesteps // full.monitor_every + 1
    return {
        "setting": name, "method": method, "steps": int(record["timesteps"]), "cpu_seconds": record["cpu_seconds"],
        "wall_seconds": record["wall_seconds"], "monitor_seconds": seconds, "monitor_passes": passes,
        "cpu_min_per_1m_steps": train / record["timesteps"] * 1e6 / 60,
        "full_run_cpu_min": (train * full.total_timesteps / record["timesteps"] + per_pass * full_passes) / 60,
        "score": record[full.score],
    }


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", nargs="+", required=True, choices=sorted(continual.SETTINGS))
    p.add_argument("--methods", nargs="+", default=["ppo"], help="bench/continual.py method names")
    p.add_argument("--steps", type=int, default=48_000, help="env steps of the piece (one task)")
    p.add_argument("--monitor-every", type=int, default=16_000, help="env steps between two monitor passes")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    if args.steps < 1 or args.monitor_every < 1:
        p.error(f"--steps and --monitor-every must be >= 1, got {args.steps} and {args.monitor_every}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.settings:
            for method in args.methods:
                row = measure(name, method, args.steps, args.monitor_every, str(Path(tmp, name)))
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
