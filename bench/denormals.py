"""Why the L2 baseline of bench/continual.py is slow on a CPU: denormal floats.

Trains one method of ``bench/continual.py``'s bandit setting task by task and prints, after every task, the
CPU time of that task and how many weights and Adam moments are denormal (non-zero, below float32's smallest
normal number 1.18e-38: CPUs process them far more slowly). ``--flush`` turns on
``torch.set_flush_denormal(True)`` (denormals read and written as zero), which changes the numbers slightly and
keeps the speed.

    python bench/denormals.py --method ppo_l2 --tasks 8            # denormals pile up, tasks get slower
    python bench/denormals.py --method ppo_l2 --tasks 8 --flush    # the same run with denormals flushed
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch as th

TINY = th.finfo(th.float32).tiny  # smallest normal float32


def _continual():
    spec = importlib.util.spec_from_file_location("bench_continual", Path(__file__).with_name("continual.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def count_denormal(tensors) -> int:
    return sum(int(((t != 0) & (t.abs() < TINY)).sum()) for t in tensors)


def main(argv=None) -> None:
    continual = _continual()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--method", choices=continual.METHODS, default="ppo_l2")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flush", action="store_true", help="torch.set_flush_denormal(True)")
    args = p.parse_args(argv)
    if args.tasks < 1:
        p.error(f"--tasks must be >= 1, got {args.tasks}")
    th.set_num_threads(1)
    if args.flush and not th.set_flush_denormal(True):
        p.error("this CPU does not support flushing denormals (torch.set_flush_denormal returned False)")
    setting = replace(continual.SETTINGS["bandit"], tasks=1)
    model, callbacks = continual.build_model(args.method, setting, continual.MethodParams(), args.seed, "cpu", None)
    print(
        f"{args.method}, seed {args.seed}, flush_denormal={args.flush}, torch {th.__version__}, "
        f"{setting.task_timesteps} steps per task"
    )
    for task in range(args.tasks):
        start = time.process_time()
        model.learn(setting.task_timesteps, callback=callbacks, reset_num_timesteps=False)
        seconds = time.process_time() - start
        weights = [p.detach() for p in model.policy.parameters()]
        state = model.policy.optimizer.state.values()
        moments = [v for s in state for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
        print(
            f"task {task}: {seconds:5.1f} CPU s, "
            f"denormal weights {count_denormal(weights)} / {sum(w.numel() for w in weights)}, "
            f"denormal Adam moments {count_denormal(moments)} / {sum(m.numel() for m in moments)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
