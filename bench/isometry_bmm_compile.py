"""Batched matrix products and torch.compile for the isometry update, against the library's per-weight loop (#16).

The decoupled update of SAC's critic weights (two Q nets of ``[256, 256]``: two weights of each shape), as
:class:`~sb3_plastic.optim.IsometryStepMixin` computes it per weight (``loop``); with the same-shape weights stacked
into one ``bmm`` (``bmm``: the library's stacked-matrix update, which LSTM gate blocks use); with ``--compile``, the
per-weight function under ``torch.compile`` (``compiled``).
7 interleaved rounds (the arms' order rotates), ``torch.utils.benchmark`` blocked autorange, CPU time, one thread;
``loop2`` is the A/A control. Ratio ``t_loop / t_arm`` (> 1: the arm is faster).

    python bench/isometry_bmm_compile.py [--compile]
"""

from __future__ import annotations

import math
import statistics
import sys
import time

import torch as th
from torch.utils import benchmark

from sb3_plastic.optim import IsometryStepMixin

#: the param group settings of the timed update (AdamO's defaults at SAC's learning rate)
GROUP = dict(lr=3e-4, isometry_coef=0.2, isometry_scale=1.0, isometry_interval=1)


def update_one(w: th.Tensor) -> th.Tensor:
    """The library's decoupled update of one weight (what ``AdamO.step`` subtracts)."""
    return IsometryStepMixin._isometry_update(w, GROUP)[0]


def update_batched(ws: list[th.Tensor]) -> list[th.Tensor]:
    """The same update of several same-shape weights in one call: the weights stacked along their rows and updated
    as blocks by the library's stacked-matrix update (``isometry_blocks``, one ``bmm`` per product, a clamp per
    block), then split again."""
    update, _ = IsometryStepMixin._block_isometry_update(th.cat(ws), GROUP, len(ws))
    return list(update.split(ws[0].shape[0]))


def main(argv: list[str]) -> int:
    th.set_num_threads(1)
    th.manual_seed(0)
    critic = [th.randn(256, 4) / 2, th.randn(256, 256) / 16, th.randn(1, 256) / 16] * 2
    groups: dict[tuple[int, ...], list[th.Tensor]] = {}
    for w in critic:
        groups.setdefault(tuple(w.shape), []).append(w)
    for batch in groups.values():
        for u, w in zip(update_batched(batch), batch):
            assert th.allclose(u, update_one(w), atol=1e-6)
    arms = {
        "loop": lambda: [update_one(w) for w in critic],
        "loop2": lambda: [update_one(w) for w in critic],
        "bmm": lambda: [update_batched(g) for g in groups.values()],
    }
    if "--compile" in argv:
        compiled = th.compile(update_one, dynamic=False)
        for w in critic:
            compiled(w)  # one compilation per shape, before the timing
        arms["compiled"] = lambda: [compiled(w) for w in critic]
    times: dict[str, list[float]] = {k: [] for k in arms}
    order = list(arms)
    for r in range(7):
        for k in order[r % len(order):] + order[: r % len(order)]:
            timer = benchmark.Timer("f()", globals=dict(f=arms[k]), timer=time.process_time)
            times[k].append(timer.blocked_autorange(min_run_time=0.5).median)
    controls = [a / b for a, b in zip(times["loop"], times["loop2"])]
    band = math.exp(max(abs(math.log(c)) for c in controls))
    print(f"loop {statistics.median(times['loop']) * 1e3:.3f} ms per critic update; "
          f"A/A [{min(controls):.3f}, {max(controls):.3f}], band {band:.3f}")
    for k in order[2:]:
        ratios = [a / b for a, b in zip(times["loop"], times[k])]
        print(f"{k}: loop / {k} = {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
