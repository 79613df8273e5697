"""How far ``isometry_interval=k`` is from the exact AdamO step: the error of one window's isometry displacement.

AdamO's exact decoupled step applies ``lr * lambda * grad R(W_j)`` at every update ``j``; with
``isometry_interval=k`` it applies ``k * lr * lambda * grad R(W_t)`` once per window ``t .. t+k-1`` (the gradient of
``R`` at the window's first weights). This script trains a network with the exact AdamO, records ``grad R(W_j)``
of every hidden weight before every update and measures, for windows of ``k`` consecutive updates along that
trajectory, the relative error of the amortised displacement

    e_k = || k * grad R(W_t) - sum_{j<k} grad R(W_{t+j}) ||_F / || sum_{j<k} grad R(W_{t+j}) ||_F

(the ``lr * lambda`` factor cancels), mean over the windows and hidden layers. A second-order error
(``(k * lr * lambda)^2``) would vanish with ``lambda`` and grow as ``k^2``; a first-order one (the task's Adam
steps, ~``lr`` per update, move ``W`` and so ``grad R`` during the window) grows linearly with the window length
and does not vanish with ``lambda``.

Task: random-label memorisation on sklearn's 8x8 digits (as ``bench/supervised.py``'s ``memorise`` probe: 256
images, 10 random labels, minibatch 32), MLP 64 -> 128 -> 128 -> 10 (ReLU, PyTorch default init), AdamO on the
hidden layers, the head in a group with ``isometry_coef=0``; ``--warmup`` updates first, then windows.

    python bench/isometry_interval.py                    # the table of bench/README.md (~1 CPU-minute)
    python bench/isometry_interval.py --lrs 1e-3 --ks 32 --coefs 0.1
    python bench/isometry_interval.py --compare          # exact vs amortised in the saved probe / grid results
    python bench/isometry_interval.py --clamp-check 10   # how much of the amortised step AdamO's clamp lets through

``--compare`` reads the runs of ``bench/supervised.py`` (``supervised_k1.json``, ``supervised_k32.json``) and of
``bench/continual.py`` (``continual_k1/summary.json``, ``continual_kauto/summary.json``) in ``--out`` (commands in
bench/README.md) and prints, per method, the exact and the amortised arm side by side with per-seed differences.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from torch import nn

from sb3_plastic.isometry import isometry_penalty_grad
from sb3_plastic.optim import AdamO

OUT = Path(__file__).resolve().parent / "results" / "isometry_interval"


def make_data(seed: int) -> tuple[th.Tensor, th.Tensor]:
    from sklearn.datasets import load_digits

    x = th.as_tensor(load_digits().data[:256], dtype=th.float32) / 16.0
    g = th.Generator().manual_seed(seed)
    return x, th.randint(0, 10, (256,), generator=g)


def trajectory(lr: float, coef: float, steps: int, seed: int) -> list[list[th.Tensor]]:
    """``grad R`` of each hidden weight before each of ``steps`` exact AdamO updates."""
    th.manual_seed(seed)
    x, y = make_data(seed)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    hidden = [net[0].weight, net[2].weight]
    rest = [p for p in net.parameters() if all(p is not q for q in hidden)]
    opt = AdamO([{"params": hidden}, {"params": rest, "isometry_coef": 0.0}], lr=lr, isometry_coef=coef)
    g = th.Generator().manual_seed(seed + 1)
    grads = []
    for _ in range(steps):
        idx = th.randint(0, 256, (32,), generator=g)
        loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        grads.append([isometry_penalty_grad(w.detach()) for w in hidden])
        opt.step()
    return grads


def window_error(grads: list[list[th.Tensor]], k: int) -> float:
    errors = []
    for start in range(0, len(grads) - k + 1, k):
        window = grads[start : start + k]
        for layer in range(len(window[0])):
            exact = sum(step[layer] for step in window)
            errors.append(float((k * window[0][layer] - exact).norm() / exact.norm().clamp_min(1e-30)))
    return float(np.mean(errors))


def _mean_last(values: list[list[float]], n: int = 5) -> list[float]:
    return [float(np.mean(v[-n:])) for v in values]


def compare(out: Path) -> None:
    """Exact (``k = 1``) vs amortised arm of the saved supervised-probe and continual-grid runs, same seeds."""
    exact, amortised = (json.loads((out / f"supervised_k{k}.json").read_text()) for k in (1, 32))
    print("supervised probes (bench/supervised.py), isometry_interval 1 vs 32 (= 'auto' for batch 32), same seeds")
    print("| probe | method | seeds | last-5 accuracy, k=1 | k=32 | per-seed k=32 - k=1 | hidden DfI at the end, k=1 | k=32 |")
    print("|---|---|---|---|---|---|---|---|")
    for probe, data in exact["probes"].items():
        for method, runs in data["methods"].items():
            other = amortised["probes"][probe]["methods"][method]
            a, b = _mean_last(runs["accuracy"]), _mean_last(other["accuracy"])
            diff = np.subtract(b, a)
            dfi_a = np.mean([v[-1] for v in runs["dfi"]])
            dfi_b = np.mean([v[-1] for v in other["dfi"]])
            print(
                f"| {probe} | {method} | {len(a)} | {np.mean(a):.3f} ± {np.std(a):.3f} | {np.mean(b):.3f} ± {np.std(b):.3f} "
                f"| {diff.mean():+.3f} [{diff.min():+.3f}, {diff.max():+.3f}] | {dfi_a:.3g} | {dfi_b:.3g} |"
            )
    grid = {k: json.loads((out / f"continual_k{k}" / "summary.json").read_text()) for k in ("1", "auto")}
    print("\ncontinual grid (bench/continual.py, bandit), isometry_interval 1 vs 'auto' (4 for batch 256), same seeds")
    print("| method | seeds | task 0, k=1 / auto | last half, k=1 | auto | per-seed auto - 1 | last half / task 0 |")
    print("|---|---|---|---|---|---|---|")
    for method, a in grid["1"]["methods"].items():
        b = grid["auto"]["methods"][method]
        diff = np.subtract(b["last_half_per_seed"], a["last_half_per_seed"])
        print(
            f"| {method} | {len(a['seeds'])} | {a['task0']:.3f} / {b['task0']:.3f} "
            f"| {a['last_half']:.3f} | {b['last_half']:.3f} "
            f"| {diff.mean():+.3f} [{diff.min():+.3f}, {diff.max():+.3f}] | {a['retained']:.2f} / {b['retained']:.2f} |"
        )


def clamp_check(tasks: int, seed: int) -> list[dict]:
    """The share of the intended amortised pull ``k * lr * lambda`` that AdamO's blow-up clamp lets through, on the
    permuted-digits probe of ``bench/supervised.py`` (its AdamO methods, their settings), ``k`` 1 and 32."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import supervised

    shares: list[float] = []
    original = AdamO.step

    def recording_step(self: AdamO, closure: Any = None) -> Any:
        loss = original(self, closure)
        group = self.param_groups[0]  # the hidden weights (the head is in a group with isometry_coef 0)
        k = group["isometry_interval"]
        for p in group["params"]:
            state = self.state[p]
            if "isometry_step" in state and state["isometry_count"] % k == 1 % k:  # applied at this step
                shares.append(float(state["isometry_step"]) / (group["lr"] * group["isometry_coef"] * k))
        return loss

    rows = []
    x, y = supervised.load_inputs()
    AdamO.step = recording_step  # type: ignore[method-assign]
    try:
        for method in ("adamo_relu", "adamo_maxmin"):
            for k in (1, 32):
                shares.clear()
                settings = supervised.method_settings(method, {method: {"isometry_interval": k}})
                cfg = dict(supervised.PROBES["permuted"], n_tasks=tasks)
                supervised.run_one("permuted", cfg, method, settings, seed, supervised.make_tasks("permuted", cfg, seed, x, y))
                r = np.array(shares)
                rows.append(dict(method=method, k=k, mean_share=float(r.mean()), clamped=float((r < 0.999).mean())))
    finally:
        AdamO.step = original  # type: ignore[method-assign]
    print(f"permuted digits, {tasks} tasks, seed {seed}: applied isometry step / (k * lr * lambda)")
    print("| method | k | mean share | fraction of steps clamped |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['method']} | {r['k']} | {r['mean_share']:.3f} | {r['clamped']:.3f} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3])
    p.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--coefs", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=200, help="exact AdamO updates before the windows")
    p.add_argument("--windows", type=int, default=8, help="windows of the largest k measured per run")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--compare", action="store_true", help="only compare the saved supervised / continual runs")
    p.add_argument("--clamp-check", type=int, metavar="TASKS", help="only the clamp check on TASKS permuted tasks")
    args = p.parse_args()
    if args.compare:
        compare(args.out)
        return
    if args.clamp_check:
        th.set_num_threads(1)
        rows = clamp_check(args.clamp_check, seed=0)
        (args.out / "clamp_check.json").write_text(json.dumps(rows, indent=1))
        return
    th.set_num_threads(1)
    start = time.time()
    rows = []
    for lr in args.lrs:
        for coef in args.coefs:
            per_seed = []
            for seed in range(args.seeds):
                grads = trajectory(lr, coef, args.warmup + args.windows * max(args.ks), seed)[args.warmup :]
                per_seed.append({k: window_error(grads, k) for k in args.ks})
            for k in args.ks:
                values = [s[k] for s in per_seed]
                rows.append(dict(lr=lr, coef=coef, k=k, error=float(np.mean(values)), per_seed=values))
    print(f"relative error of a window's isometry displacement, isometry_interval=k vs the exact step "
          f"(mean over {args.windows * max(args.ks)} updates after {args.warmup}, 2 hidden layers, {args.seeds} seeds)")
    kmin, kmax = min(args.ks), max(args.ks)
    print("| lr | lambda | " + " | ".join(f"k={k}" for k in args.ks) + f" | e(k={kmax}) / e(k={kmin}) |")
    print("|---|---|" + "---|" * len(args.ks) + "---|")
    for lr in args.lrs:
        for coef in args.coefs:
            errs = {r["k"]: r["error"] for r in rows if r["lr"] == lr and r["coef"] == coef}
            cells = " | ".join(f"{100 * errs[k]:.2f} %" for k in args.ks)
            print(f"| {lr:g} | {coef:g} | {cells} | {errs[kmax] / errs[kmin]:.1f} |")
    print(f"(an error linear in the window length, ~ (k - 1), gives e({kmax}) / e({kmin}) = {(kmax - 1) / (kmin - 1):.0f}; "
          f"a quadratic one ~ (k^2 - 1) gives {(kmax**2 - 1) / (kmin**2 - 1):.0f})")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "window_error.json"
    path.write_text(json.dumps(dict(settings={k: v for k, v in vars(args).items() if k != "out"}, rows=rows), indent=1))
    print(f"{time.time() - start:.0f} s; wrote {path}")


if __name__ == "__main__":
    main()
