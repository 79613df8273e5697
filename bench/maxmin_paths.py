"""MaxMin's two implementations against each other, per input shape (issue #16).

:class:`~sb3_plastic.activations.MaxMin` has two paths that give the same bits: a gather with the index of each
pair's larger element (autograd's scatter backward) and, for large ``(N, C, *spatial)`` inputs, a masked swap of the
raw bits whose backward is the same swap (``BITWISE_MIN_PLANE`` / ``BITWISE_MIN_NUMEL`` choose). This script times
both on the shapes MaxMin networks see (MinAtar and Nature-CNN feature maps at train and rollout batch sizes, MLP
layers) so that the bounds rest on a measurement.

Arms per shape: ``A`` the gather path, ``A'`` the gather path again (the A/A control), ``B`` the bitwise path, each
forced by setting the bounds. Work: forward + backward of one call (``train``) and a ``no_grad`` forward
(``forward``). ``--rounds`` interleaved rounds (the arms' order rotates), ``torch.utils.benchmark`` blocked
autorange, CPU time (``--device cuda``: the wall clock, read after synchronising the GPU); ratio ``t_A / t_B`` (> 1:
the bitwise path is faster). ``verdict``: ``bitwise faster`` / ``gather faster`` only where the A/A band resolves
the median against 1, else ``not resolved``; ``chosen`` is the path the library takes for that shape, ``agrees``
whether it is the faster one (or the difference is not resolved).

Examples::

    python bench/maxmin_paths.py                       # every shape, ~3 minutes on one core
    python bench/maxmin_paths.py --rounds 3 --min-run-time 0.1 --json /tmp/maxmin_paths.json
    python bench/maxmin_paths.py --device cuda --json /tmp/maxmin_paths_cuda.json   # on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch as th
from torch.utils import benchmark

from sb3_plastic import activations
from sb3_plastic.activations import MaxMin

#: ``(name, shape)``: what MaxMin networks feed the activation (batch 256 in training, 8 or 32 in rollouts).
SHAPES: list[tuple[str, tuple[int, ...]]] = [
    ("minatar conv, train", (256, 16, 8, 8)),
    ("minatar conv, rollout", (8, 16, 8, 8)),
    ("nature conv1, train", (256, 32, 20, 20)),
    ("nature conv2, train", (256, 64, 9, 9)),
    ("nature conv3, train", (256, 64, 7, 7)),
    ("nature conv3, rollout", (8, 64, 7, 7)),
    ("dqn nature conv3, batch 32", (32, 64, 7, 7)),
    ("mlp 256, batch 256", (256, 256)),
    ("mlp 128, batch 256", (256, 128)),
    ("small maps, 2x2", (2048, 16, 2, 2)),
]


@contextlib.contextmanager
def forced(path: str) -> Iterator[None]:
    """Make MaxMin take ``path`` (``"gather"`` / ``"bitwise"``) for every eligible input while inside."""
    saved = activations.BITWISE_MIN_PLANE, activations.BITWISE_MIN_NUMEL, activations.BITWISE_DEVICE_TYPES
    if path == "bitwise":
        activations.BITWISE_MIN_PLANE, activations.BITWISE_MIN_NUMEL = 1, 1
        activations.BITWISE_DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu", "meta")
    elif path == "gather":
        activations.BITWISE_MIN_NUMEL = 2**62
    else:
        raise ValueError(f"path must be 'gather' or 'bitwise', got {path!r}")
    try:
        yield
    finally:
        activations.BITWISE_MIN_PLANE, activations.BITWISE_MIN_NUMEL, activations.BITWISE_DEVICE_TYPES = saved


def clock_of(device: str) -> Callable[[], float]:
    """CPU time on the CPU; on an accelerator the wall clock read after synchronising it (``benchmark.timer``,
    torch's default Timer clock: a Timer given ``timeit.default_timer`` would not synchronise)."""
    return time.process_time if th.device(device).type == "cpu" else benchmark.timer


def _timed(shape: tuple[int, ...], path: str, work: str, min_run_time: float, device: str = "cpu") -> float:
    x = th.randn(shape).to(device).requires_grad_(work == "train")
    g = th.randn(shape).to(device)
    act = MaxMin()
    with forced(path):
        if work == "train":
            stmt = "th.autograd.grad(act(x), x, g)"
        else:
            stmt = "with th.no_grad(): act(x)"
        timer = benchmark.Timer(stmt, globals=dict(th=th, act=act, x=x, g=g), timer=clock_of(device))
        return float(timer.blocked_autorange(min_run_time=min_run_time).median)


def verdict(median: float, band: float) -> str:
    """Which path is faster, where the A/A band resolves the median ratio against 1."""
    if median / band > 1.0:
        return "bitwise faster"
    if median * band < 1.0:
        return "gather faster"
    return "not resolved"


def measure(name: str, shape: tuple[int, ...], work: str, rounds: int, min_run_time: float,
            device: str = "cpu") -> dict[str, Any]:
    """Interleaved rounds of the three arms on one shape; ratios, A/A band and verdict."""
    arms = [("A", "gather"), ("A'", "gather"), ("B", "bitwise")]
    times: dict[str, list[float]] = {arm: [] for arm, _ in arms}
    for r in range(rounds):
        for arm, path in arms[r % 3:] + arms[: r % 3]:
            times[arm].append(_timed(shape, path, work, min_run_time, device))
    ratios = [a / b for a, b in zip(times["A"], times["B"])]
    controls = [a / a2 for a, a2 in zip(times["A"], times["A'"])]
    band = math.exp(max(abs(math.log(c)) for c in controls))
    median = statistics.median(ratios)
    chosen = "bitwise" if activations._takes_bitwise_path(th.empty(shape, device=device)) else "gather"
    found = verdict(median, band)
    agrees = found == "not resolved" or found.startswith(chosen)
    return dict(name=name, shape=list(shape), work=work, device=device, times=times, ratios=ratios,
                controls=controls, median=median, band=band, verdict=found, chosen=chosen, agrees=agrees)


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| input | shape | work | gather / bitwise time [min, max] | A/A [min, max] | verdict | chosen | agrees |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r['name']} | {tuple(r['shape'])} | {r['work']} | {r['median']:.3f} [{min(r['ratios']):.3f}, "
            f"{max(r['ratios']):.3f}] | [{min(r['controls']):.3f}, {max(r['controls']):.3f}] | {r['verdict']} | "
            f"{r['chosen']} | {'yes' if r['agrees'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per shape and work (default 5)")
    p.add_argument("--min-run-time", type=float, default=0.3, help="seconds per blocked_autorange (default 0.3)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="torch device of the inputs: cpu (CPU time), cuda (wall clock)")
    p.add_argument("--only", nargs="+", type=int, metavar="INDEX", help="indices into SHAPES (default: all)")
    p.add_argument("--json", help="write every timing and ratio to this file")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.min_run_time <= 0:
        p.error(f"--min-run-time must be > 0, got {args.min_run_time}")
    try:
        device = th.device(args.device)
    except RuntimeError as e:
        p.error(f"--device {args.device!r} is not a torch device ({e})")
    if device.type == "cuda" and not th.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device is available")
    shapes = SHAPES if args.only is None else []
    for i in args.only or []:
        if not 0 <= i < len(SHAPES):
            p.error(f"--only index {i} is outside 0..{len(SHAPES) - 1}")
        shapes.append(SHAPES[i])
    th.set_num_threads(args.threads)
    th.manual_seed(args.seed)
    results = []
    for name, shape in shapes:
        for work in ("train", "forward"):
            results.append(measure(name, shape, work, args.rounds, args.min_run_time, args.device))
            r = results[-1]
            print(f"{name} {shape} {work}: gather/bitwise {r['median']:.3f}, A/A band {r['band']:.3f}", flush=True)
    clock = "cpu time" if clock_of(args.device) is time.process_time else "wall clock"
    where = th.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    header = (f"torch {th.__version__}, {where}, device {args.device} ({clock}), threads {args.threads}, "
              f"rounds {args.rounds}")
    print(f"\n{header}\n{table(results)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=header, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
