"""Supervised plasticity probes at CPU scale (issue 7, part 2).

Two probes from the source papers, each a sequence of tasks learnt one after the other by the same
network, without resets. Plasticity is the ability to fit each new task; its loss shows as an accuracy at
the end of each task that falls from task to task.

* ``memorise`` (random-label memorisation; Lyle et al. 2023, Kumar et al. 2023, Rosseau et al. 2026): a fixed
  set of inputs (``n_samples`` images of sklearn's bundled digits data set) gets new uniformly random labels
  (10 classes) at every task; the network trains ``epochs`` epochs of minibatches on it. Score: accuracy on
  those same samples with that task's labels at the end of the task (the memorised fraction; chance 0.1).
* ``permuted`` (Permuted MNIST of Dohare et al. 2024, with sklearn's 8x8 digits instead of MNIST): every task
  draws a new permutation of the 64 pixels, applied to every image; the network trains ``epochs`` epochs on the
  permuted training split. Score: accuracy on the held-out split under that task's permutation.

The digits ship inside scikit-learn (``sklearn.datasets.load_digits``, 1797 images): nothing is downloaded.
Inputs are scaled to [0, 1], centred per pixel and divided by the global standard deviation.

Every method trains the same MLP, 64 -> ``width`` x ``depth`` -> 10, with cross-entropy and minibatch Adam
(or AdamO); for a seed, every method sees the same inputs, labels, permutations and minibatch order, and
every ReLU method starts from the same weights. Methods (hyper-parameters in ``METHODS``; the tuning runs
are in bench/README.md, "Supervised plasticity probes"):

* ``adam``: ReLU, PyTorch's default init, ``torch.optim.Adam``: the baseline.
* ``l2``: the same with L2 regularisation in the gradient (``Adam(weight_decay=...)``, coupled, as in
  Dohare et al.'s Adam runs).
* ``snp``: Shrink & Perturb, Dohare et al.'s *continual* form: the L2 of ``l2`` plus Gaussian noise
  ``N(0, sigma^2)`` added to every weight and bias after each optimizer step
  (:func:`sb3_plastic.callbacks.shrink_perturb.continual_shrink_perturb_` with its decoupled shrink off).
* ``snp_task``: Shrink & Perturb, Ash & Adams' *event* form at each task switch:
  ``theta <- lambda theta + p theta_fresh`` on every layer, ``lambda = 0.8, p = 0.1`` (Ash & Adams: 0.4, 0.1)
  (:func:`~sb3_plastic.callbacks.shrink_perturb.shrink_perturb_`),
  Adam state of the touched tensors dropped.
* ``cbp``: Continual Backprop (Dohare et al. 2024): :class:`sb3_plastic.callbacks.cbp.GenerateAndTest` on the hidden
  layers after every optimizer step (contribution utility, decay 0.99), Adam moments of replaced rows / columns zeroed.
* ``fire``: FIRE (arXiv 2602.08040) at each task switch: every hidden weight replaced by its scaled polar factor
  (:func:`sb3_plastic.callbacks.fire.fire_`: the exact U V^T by default since issue #13; the full-mode rows in
  bench/README.md before that used the reference's 10 Newton–Schulz steps), then the Adam state of the rewritten
  weights dropped. The reference also rewrites the output layer (``fire_layers="all"``); leaving it out did slightly
  better here.
* ``adamo_relu``: ReLU, default init, AdamO (decoupled isometry step on the hidden layers; the head in a group with
  ``isometry_coef=0``, as the plastic policies do).
* ``adamo_maxmin``: MaxMin (GroupSort-2) with orthogonal init (gain 1) on every layer, AdamO as above.
* ``l2_init``: L2-init (Kumar et al., 2023): ``lambda * ||theta - theta_0||^2`` on every parameter, its gradient
  :func:`sb3_plastic.callbacks.regularisers.l2_init_grad` added after ``backward()`` (the isometry paper's baseline,
  issue #15).
* ``spectral``: spectral regularisation (Lewandowski et al., 2024): ``lambda * sum_l [(sigma_1(W_l)^2 - 1)^2 +
  ||b_l||^4]`` on every layer (head included), one persistent power iteration per step (the functions of
  :class:`sb3_plastic.callbacks.SpectralRegularisation`; results committed before 2026-12-02 used the earlier
  ``(sigma_1([W_l | b_l])^2 - 1)^2``, now ``bias_as_column=True``).
* ``nap``: Normalize-and-Project (Lyle et al., 2024): a LayerNorm before each ReLU
  (:func:`sb3_plastic.callbacks.nap.insert_layer_norms_`) and each normalised layer's ``[W, b]`` projected to its
  initial norm after every step (:func:`sb3_plastic.callbacks.nap.project_`).

Diagnostics recorded at the end of each task, on the probe's evaluation inputs: the fraction of dormant hidden
units (ReDo score <= 0.025, :func:`sb3_plastic.diagnostics.dormant_fraction`; MaxMin pairs count as one unit), the
effective rank of the last hidden layer's features (:func:`sb3_plastic.diagnostics.effective_rank`), the summed
deviation from isometry of the hidden weights (:func:`sb3_plastic.isometry.dfi_per_layer`, head left out) and the
norm of all weights.

    python bench/supervised.py --quick                 # ~1 minute: 2 seeds, few tasks; table, JSON, CSV, PNG
    python bench/supervised.py --jobs 2                # full mode, 2 processes (see bench/README.md for its run time)
    python bench/supervised.py --replot bench/results/supervised.json   # tables and PNGs of a saved run
    python bench/supervised.py --seeds 3 --tasks 20 --methods adam cbp --hp cbp.replacement_rate=1e-3 --out /tmp/x

Outputs in ``--out`` (default ``bench/results``; file stem ``--tag``: ``supervised``, or ``supervised_quick`` in quick
mode): ``supervised.json`` (settings, per seed and task values), ``supervised.csv`` (one row per probe, method, seed
and task; ``train_accuracy`` equals ``accuracy`` for ``memorise``), ``supervised.png`` (accuracy at the end of each
task vs task index, one column per probe, full range and zoomed, mean over seeds with a min-max band) and
``supervised_diagnostics.png``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch as th
from torch import nn

from sb3_plastic.activations import MaxMin
from sb3_plastic.callbacks.cbp import GenerateAndTest
from sb3_plastic.callbacks.fire import fire_
from sb3_plastic.callbacks.nap import insert_layer_norms_, normalized_layers, project_
from sb3_plastic.callbacks.redo import default_layer_init, orthogonal_layer_init
from sb3_plastic.callbacks.regularisers import (
    SpectralBlock,
    l2_init_grad,
    power_iteration,
    spectral_bias_penalty_grad,
    spectral_penalty_grad,
)
from sb3_plastic.callbacks.shrink_perturb import continual_shrink_perturb_, shrink_perturb_
from sb3_plastic.common.surgery import Consumer, HiddenLayer
from sb3_plastic.diagnostics import dormant_fraction, effective_rank
from sb3_plastic.isometry import dfi_per_layer, orthogonal_init_network_
from sb3_plastic.optim import AdamO, reset_optimizer_state

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
DORMANT_TAU = 0.025
#: Lower edge of the zoomed accuracy panels of the main figure.
ZOOM_LOW = 0.85

# ---------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------
#: Shared by every method: the optimiser's learning rate, Adam's betas and eps, the MLP, the minibatch size.
NETWORK = dict(width=128, depth=2)

#: The probes, full mode. ``--quick`` replaces some values (QUICK_PROBES); ``--tasks`` replaces ``n_tasks``.
PROBES: dict[str, dict[str, Any]] = {
    "memorise": dict(
        title="random-label memorisation",
        n_samples=256,
        n_classes=10,
        n_tasks=30,
        epochs=20,
        batch_size=32,
        lr=3e-3,
        metric="train accuracy on the memorised samples",
    ),
    "permuted": dict(
        title="permuted digits",
        n_test=297,
        n_tasks=40,
        epochs=2,
        batch_size=32,
        lr=1e-2,
        metric="held-out accuracy under the task's permutation",
    ),
}
QUICK_PROBES: dict[str, dict[str, Any]] = {
    "memorise": dict(n_tasks=6, epochs=20),
    "permuted": dict(n_tasks=6, epochs=2),
}
FULL_SEEDS = 5
QUICK_SEEDS = 2

#: The methods and their hyper-parameters (the values chosen after the tuning runs of bench/README.md).
METHODS: dict[str, dict[str, Any]] = {
    "adam": dict(label="Adam (ReLU)"),
    "l2": dict(label="Adam + L2", weight_decay=1e-2),
    "snp": dict(label="S&P (L2 + noise / step)", weight_decay=1e-2, noise_std=1e-3),
    "snp_task": dict(label="S&P (at task switch)", shrink=0.8, perturb=0.1),
    "cbp": dict(label="Continual Backprop", replacement_rate=1e-2, maturity_threshold=100, decay_rate=0.99),
    "fire": dict(label="FIRE (at task switch)", fire_layers="hidden"),
    "adamo_relu": dict(label="ReLU + AdamO", isometry_coef=0.2),  # 0.1 before issue #27 (no 1/2 in R)
    "adamo_maxmin": dict(label="MaxMin + AdamO (ortho)", activation="maxmin", orthogonal=True, isometry_coef=2.0),
    "l2_init": dict(label="L2-init", l2_init_coef=1e-2),
    "spectral": dict(label="Spectral reg.", spectral_coef=1e-3),
    "nap": dict(label="NaP", nap=True),
}
#: Rule used to pick the values above: among the values tried (bench/README.md), the best mean accuracy over the
#: last 5 tasks of both probes (2 seeds each), the probes' learning rates fixed beforehand with plain Adam.


def _method_defaults() -> dict[str, Any]:
    return dict(
        label="?",
        activation="relu",
        orthogonal=False,
        weight_decay=0.0,
        noise_std=0.0,
        shrink=None,
        perturb=None,
        replacement_rate=0.0,
        maturity_threshold=100,
        decay_rate=0.99,
        fire_layers=None,
        isometry_coef=0.0,
        isometry_scale=1.0,
        isometry_interval=1,
        l2_init_coef=0.0,
        spectral_coef=0.0,
        nap=False,
    )


def method_settings(name: str, overrides: Optional[dict[str, dict[str, Any]]] = None) -> dict[str, Any]:
    """Full settings of a method: defaults, then ``METHODS[name]``, then ``overrides[name]``."""
    settings = _method_defaults()
    settings.update(METHODS[name])
    settings.update((overrides or {}).get(name, {}))
    unknown = set(settings) - set(_method_defaults())
    if unknown:
        raise ValueError(f"unknown setting(s) {sorted(unknown)} for method {name!r}; known: {sorted(_method_defaults())}")
    return settings


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------
def load_inputs() -> tuple[th.Tensor, th.Tensor]:
    """sklearn's digits as float32 ``(1797, 64)`` inputs (scaled, centred per pixel, unit global std) and labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit(
            "bench/supervised.py needs scikit-learn for its bundled digits data set: pip install -e '.[bench]'"
        ) from exc
    digits = load_digits()
    x = th.as_tensor(digits.data, dtype=th.float32) / 16.0
    x = x - x.mean(dim=0, keepdim=True)
    x = x / x.std()
    return x, th.as_tensor(digits.target, dtype=th.long)


@dataclass
class Task:
    """One task: training inputs / labels and evaluation inputs / labels (already permuted)."""

    x_train: th.Tensor
    y_train: th.Tensor
    x_eval: th.Tensor
    y_eval: th.Tensor


def make_tasks(probe: str, cfg: dict[str, Any], seed: int, x_all: th.Tensor, y_all: th.Tensor) -> list[Task]:
    """The task sequence of a probe for a seed (independent of the method)."""
    gen = th.Generator().manual_seed(10_000 + seed)
    order = th.randperm(x_all.shape[0], generator=gen)
    tasks = []
    if probe == "memorise":
        x = x_all[order[: cfg["n_samples"]]]
        for _ in range(cfg["n_tasks"]):
            y = th.randint(0, cfg["n_classes"], (x.shape[0],), generator=gen)
            tasks.append(Task(x, y, x, y))
    elif probe == "permuted":
        test, train = order[: cfg["n_test"]], order[cfg["n_test"] :]
        for _ in range(cfg["n_tasks"]):
            perm = th.randperm(x_all.shape[1], generator=gen)
            tasks.append(Task(x_all[train][:, perm], y_all[train], x_all[test][:, perm], y_all[test]))
    else:
        raise ValueError(f"unknown probe {probe!r}; known: {list(PROBES)}")
    return tasks


# ---------------------------------------------------------------------------------------------------
# Network and method
# ---------------------------------------------------------------------------------------------------
def make_network(settings: dict[str, Any], in_dim: int, n_classes: int, seed: int) -> nn.Sequential:
    """``depth`` x (Linear(width) + activation), then a Linear head; default or orthogonal (gain 1) init."""
    act = MaxMin if settings["activation"] == "maxmin" else nn.ReLU
    th.manual_seed(seed)
    layers: list[nn.Module] = []
    width_in = in_dim
    for _ in range(NETWORK["depth"]):
        layers += [nn.Linear(width_in, NETWORK["width"]), act()]
        width_in = NETWORK["width"]
    net = nn.Sequential(*layers, nn.Linear(width_in, n_classes))
    if settings["orthogonal"]:
        orthogonal_init_network_(net, gain=1.0)
    if settings["nap"]:
        insert_layer_norms_(net)
    return net


def linear_layers(net: nn.Sequential) -> list[nn.Linear]:
    return [m for m in net if isinstance(m, nn.Linear)]


def hidden_specs(net: nn.Sequential) -> list[HiddenLayer]:
    """Each hidden Linear with the activation after it and the Linear that reads it (for Continual Backprop)."""
    modules = list(net)
    specs = []
    for i, module in enumerate(modules[:-1]):
        if isinstance(module, nn.Linear):
            specs.append(HiddenLayer(str(i), module, modules[i + 1], [Consumer(modules[i + 2])]))
    return specs


def make_optimizer(net: nn.Sequential, settings: dict[str, Any], lr: float) -> th.optim.Optimizer:
    if settings["isometry_coef"] > 0:
        head = list(net[-1].parameters())
        hidden = [p for p in net.parameters() if all(p is not q for q in head)]
        groups = [{"params": hidden}, {"params": head, "isometry_coef": 0.0}]
        return AdamO(
            groups,
            lr=lr,
            isometry_coef=settings["isometry_coef"],
            isometry_scale=settings["isometry_scale"],
            isometry_mode="decoupled",
            isometry_interval=settings["isometry_interval"],
        )
    return th.optim.Adam(net.parameters(), lr=lr, weight_decay=settings["weight_decay"])


def layer_init(settings: dict[str, Any]):
    """The initialiser the network was built with (fresh draws for Shrink & Perturb's event form)."""
    return orthogonal_layer_init(1.0) if settings["orthogonal"] else default_layer_init


def on_task_switch(net: nn.Sequential, opt: th.optim.Optimizer, settings: dict[str, Any]) -> None:
    """The task-switch interventions (FIRE, S&P event form), applied before training on tasks 2, 3, ..."""
    if settings["fire_layers"] is not None:
        layers = linear_layers(net)
        if settings["fire_layers"] == "hidden":
            layers = layers[:-1]
        for layer in fire_(layers):
            reset_optimizer_state(opt, layer.weight)
    if settings["shrink"] is not None:
        shrink_perturb_(linear_layers(net), settings["shrink"], settings["perturb"], layer_init(settings), [opt])


@th.no_grad()
def evaluate(net: nn.Sequential, x: th.Tensor, y: th.Tensor) -> dict[str, float]:
    """Accuracy and diagnostics on ``(x, y)`` (eval mode, no grad)."""
    net.eval()
    h = x
    hidden: list[tuple[th.Tensor, int]] = []
    modules = list(net)
    for i, module in enumerate(modules):
        h = module(h)
        if i < len(modules) - 1 and not isinstance(module, (nn.Linear, nn.LayerNorm)):
            hidden.append((h, 2 if isinstance(module, MaxMin) else 1))
    net.train()
    dfi = list(dfi_per_layer(net).values())
    return {
        "accuracy": float((h.argmax(dim=1) == y).float().mean()),
        "dormant": float(np.mean([dormant_fraction(a, DORMANT_TAU, g) for a, g in hidden])),
        "erank": effective_rank(hidden[-1][0]),
        "dfi": float(sum(dfi[:-1])),
        "weight_norm": float(th.sqrt(sum((m.weight.detach() ** 2).sum() for m in linear_layers(net)))),
    }


def run_one(probe: str, cfg: dict[str, Any], method: str, settings: dict[str, Any], seed: int, tasks: Sequence[Task]) -> dict:
    """Train one method on one seed's task sequence; per-task evaluations and a few counts."""
    n_classes = 10
    net = make_network(settings, tasks[0].x_train.shape[1], n_classes, seed).to(tasks[0].x_train.device)
    opt = make_optimizer(net, settings, cfg["lr"])
    engine = None
    if settings["replacement_rate"] > 0:
        engine = GenerateAndTest(
            hidden_specs(net),
            opt,
            replacement_rate=settings["replacement_rate"],
            maturity_threshold=settings["maturity_threshold"],
            decay_rate=settings["decay_rate"],
            utility="contribution",
            init="orthogonal" if settings["orthogonal"] else "default",
        )
        engine.attach()
    noisy = [p for p in net.parameters()] if settings["noise_std"] > 0 else []
    penalty = PenaltySteps(net, settings)
    batches = th.Generator().manual_seed(20_000 + seed)
    th.manual_seed(30_000 + seed)  # fresh draws of interventions (S&P noise, CBP's new units, S&P event)
    start = time.perf_counter()
    per_task: list[dict[str, float]] = []
    steps = 0
    net.train()
    try:
        for t, task in enumerate(tasks):
            if t > 0:
                on_task_switch(net, opt, settings)
            n = task.x_train.shape[0]
            for _ in range(cfg["epochs"]):
                order = th.randperm(n, generator=batches)
                for i in range(0, n, cfg["batch_size"]):
                    idx = order[i : i + cfg["batch_size"]]
                    loss = nn.functional.cross_entropy(net(task.x_train[idx]), task.y_train[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    penalty.add_gradients()
                    opt.step()
                    penalty.after_step()
                    if noisy:
                        continual_shrink_perturb_(noisy, cfg["lr"], 0.0, settings["noise_std"])
                    steps += 1
            result = evaluate(net, task.x_eval, task.y_eval)
            if probe == "permuted":
                result["train_accuracy"] = evaluate(net, task.x_train, task.y_train)["accuracy"]
            per_task.append(result)
    finally:
        if engine is not None:
            engine.detach()
    replaced = sum(engine.replaced(name) for name in engine.layers) if engine is not None else 0
    return {"per_task": per_task, "seconds": time.perf_counter() - start, "steps": steps, "cbp_replaced": replaced}


class PenaltySteps:
    """The isometry paper's baselines in the probe's training loop, with the library's functions: L2-init's and the
    spectral penalty's gradients added after ``backward()`` (no clipping here), NaP's projection after the step."""

    def __init__(self, net: nn.Sequential, settings: dict[str, Any]) -> None:
        self.l2_coef = settings["l2_init_coef"]
        self.spectral_coef = settings["spectral_coef"]
        self.theta0 = [p.detach().clone() for p in net.parameters()] if self.l2_coef > 0 else []
        self.params = list(net.parameters())
        self.blocks = [SpectralBlock(str(i), m.weight) for i, m in enumerate(linear_layers(net))]
        self.biases = [m.bias for m in linear_layers(net)]
        gen = th.Generator().manual_seed(0)
        self.u = [th.randn(b.weight.shape[0], generator=gen) for b in self.blocks] if self.spectral_coef > 0 else []
        self.projected = normalized_layers(net) if settings["nap"] else []
        self.norms = [float(th.sqrt(m.weight.detach().pow(2).sum() + m.bias.detach().pow(2).sum())) for m in self.projected]

    @th.no_grad()
    def add_gradients(self) -> None:
        for p, p0 in zip(self.params, self.theta0):
            p.grad.add_(l2_init_grad(p, p0, self.l2_coef))
        for i, (block, u) in enumerate(zip(self.blocks, self.u)):
            u, v, sigma = power_iteration(block.matrix(), u / u.norm())
            self.u[i] = u
            block.weight.grad.add_(spectral_penalty_grad(u, v, sigma, self.spectral_coef))
        if self.spectral_coef > 0:
            for bias in self.biases:
                bias.grad.add_(spectral_bias_penalty_grad(bias, self.spectral_coef))

    def after_step(self) -> None:
        for layer, norm in zip(self.projected, self.norms):
            project_(layer, norm)


_INPUTS: dict[str, tuple[th.Tensor, th.Tensor]] = {}


def run_job(
    probe: str, cfg: dict[str, Any], method: str, settings: dict[str, Any], seed: int, threads: int, device: str
) -> dict:
    """One (probe, method, seed) run from scratch: what ``--jobs`` workers execute (also used with ``--jobs 1``)."""
    th.set_num_threads(threads)
    if device not in _INPUTS:
        x_all, y_all = load_inputs()
        _INPUTS[device] = (x_all.to(device), y_all.to(device))
    tasks = make_tasks(probe, cfg, seed, *_INPUTS[device])
    return run_one(probe, cfg, method, settings, seed, tasks)


# ---------------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------------
def summarise(values: np.ndarray) -> dict[str, list[float]]:
    """Per-task mean, std (ddof=1 when > 1 seed), min and max over seeds of a ``(seeds, tasks)`` array."""
    std = values.std(axis=0, ddof=1) if values.shape[0] > 1 else np.zeros(values.shape[1])
    return {
        "mean": values.mean(axis=0).tolist(),
        "std": std.tolist(),
        "min": values.min(axis=0).tolist(),
        "max": values.max(axis=0).tolist(),
    }


def window(n_tasks: int) -> int:
    """Tasks averaged for the "first" and "last" summary rows."""
    return max(1, min(5, n_tasks // 3))


def table(probe: str, results: dict[str, Any], methods: Sequence[str], labels: dict[str, str]) -> str:
    """Markdown table: a row per task (mean ± std over seeds), then first-/last-window means and the last-window
    difference to plain Adam, of the probe's score."""
    acc = {m: np.array(results[m]["accuracy"]) for m in methods}
    n_tasks = next(iter(acc.values())).shape[1]
    w = window(n_tasks)
    head = ["task", *[labels[m] for m in methods]]
    rows = []
    for t in range(n_tasks):
        rows.append([str(t + 1), *[f"{acc[m][:, t].mean():.3f} ± {_std(acc[m][:, t]):.3f}" for m in methods]])
    first = {m: acc[m][:, :w].mean(axis=1) for m in methods}
    last = {m: acc[m][:, -w:].mean(axis=1) for m in methods}
    rows.append([f"first {w}", *[f"{first[m].mean():.3f} ± {_std(first[m]):.3f}" for m in methods]])
    rows.append([f"last {w}", *[f"{last[m].mean():.3f} ± {_std(last[m]):.3f}" for m in methods]])
    if "adam" in methods:
        base = last["adam"]
        cells = []
        for m in methods:
            diff = last[m] - base
            cells.append(f"{diff.mean():+.3f} [{diff.min():+.3f}, {diff.max():+.3f}]")
        rows.append([f"last {w} − Adam", *cells])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(head)) + " |"]
    lines.append("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |" for r in rows]
    return "\n".join(lines)


def diagnostics_table(probe: str, results: dict[str, Any], methods: Sequence[str], labels: dict[str, str]) -> str:
    """One row per method: diagnostics at the end of the first and of the last task (mean over seeds)."""
    keys = [("dormant", "dormant"), ("erank", "eff. rank"), ("dfi", "hidden DfI"), ("weight_norm", "‖W‖")]
    head = ["method", *[f"{name} first→last" for _, name in keys], "CBP units replaced", "s/run"]
    rows = []
    for m in methods:
        r = results[m]
        cells = [labels[m]]
        for key, _ in keys:
            v = np.array(r[key])
            cells.append(f"{_fmt(v[:, 0].mean())} → {_fmt(v[:, -1].mean())}")
        cells.append(f"{np.mean(r['cbp_replaced']):.0f}")
        cells.append(f"{np.mean(r['seconds']):.1f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(head)) + " |"]
    lines.append("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |" for r in rows]
    return "\n".join(lines)


def _std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def plot(path: Path, results: dict[str, Any], methods: Sequence[str], labels: dict[str, str], keys: Sequence[tuple[str, str]]):
    """One panel per probe (columns) and key (rows); mean over seeds with a min-max band, per method."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    probes = list(results["probes"])
    fig = Figure(figsize=(6.2 * len(probes), 3.8 * len(keys)))
    FigureCanvasAgg(fig)
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    styles = {m: ("--" if m in ("adam",) else "-") for m in methods}
    for row, (key, ylabel) in enumerate(keys):
        for col, probe in enumerate(probes):
            ax = fig.add_subplot(len(keys), len(probes), row * len(probes) + col + 1)
            probe_results = results["probes"][probe]
            for m in methods:
                values = np.array(probe_results["methods"][m]["accuracy" if key == "accuracy_zoom" else key])
                tasks = np.arange(1, values.shape[1] + 1)
                ax.plot(tasks, values.mean(axis=0), styles[m], color=colours[m], label=labels[m], lw=1.6)
                ax.fill_between(tasks, values.min(axis=0), values.max(axis=0), color=colours[m], alpha=0.12, lw=0)
            cfg = probe_results["config"]
            if row == 0:
                ax.set_title(f"{cfg['title']} ({len(probe_results['seeds'])} seeds)\nscore: {cfg['metric']}", fontsize=10)
            if key == "accuracy":
                ax.set_ylabel("accuracy at the end of the task")
                ax.set_ylim(0, 1.02)
                ax.axhline(0.1, color="grey", lw=0.8, ls=":")
            elif key == "accuracy_zoom":
                ax.set_ylabel(ylabel)
                ax.set_ylim(ZOOM_LOW, 1.005)
            else:
                ax.set_ylabel(ylabel)
                if key == "dfi":
                    ax.set_yscale("log")
            ax.set_xlabel("task")
            ax.grid(alpha=0.3)
            if row == 0 and col == len(probes) - 1:
                ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


CSV_KEYS = ("accuracy", "train_accuracy", "dormant", "erank", "dfi", "weight_norm")


def write_data(results: dict[str, Any], out: Path, tag: str) -> list[Path]:
    """``<tag>.json`` (everything) and ``<tag>.csv`` (a row per probe, method, seed and task) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{tag}.json"
    json_path.write_text(json.dumps(results, indent=1))
    csv_path = out / f"{tag}.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["probe", "method", "seed", "task", *CSV_KEYS])
        for probe, pr in results["probes"].items():
            for method, entry in pr["methods"].items():
                for s, seed in enumerate(pr["seeds"]):
                    for t in range(len(entry["accuracy"][s])):
                        writer.writerow([probe, method, seed, t + 1, *(f"{entry[k][s][t]:.6g}" for k in CSV_KEYS)])
    return [json_path, csv_path]


def write_figures(results: dict[str, Any], out: Path, tag: str) -> list[Path]:
    """``<tag>.png`` (accuracy at the end of each task, full range and zoomed) and ``<tag>_diagnostics.png``."""
    out.mkdir(parents=True, exist_ok=True)
    methods = list(next(iter(results["probes"].values()))["methods"])
    labels = {m: results["methods"][m]["label"] for m in methods}
    png = out / f"{tag}.png"
    plot(png, results, methods, labels, [("accuracy", "accuracy"), ("accuracy_zoom", f"zoom: accuracy ≥ {ZOOM_LOW}")])
    diag = out / f"{tag}_diagnostics.png"
    keys = [
        ("dormant", "fraction of dormant hidden units"),
        ("erank", "effective rank, last hidden layer"),
        ("dfi", "hidden DfI"),
    ]
    plot(diag, results, methods, labels, keys)
    return [png, diag]


def print_probe(probe: str, entry: dict[str, Any], labels: dict[str, str]) -> None:
    """The tables of one probe (see :func:`table` and :func:`diagnostics_table`)."""
    cfg, methods = entry["config"], list(entry["methods"])
    cfg_text = ", ".join(f"{k}={v}" for k, v in cfg.items() if k not in ("title", "metric"))
    print(f"\n## {probe}: {cfg['title']} ({cfg_text}; MLP {NETWORK}); score: {cfg['metric']}")
    print(f"mean ± std over {len(entry['seeds'])} seeds; last row: per-seed difference to Adam, mean [min, max]")
    print(table(probe, entry["methods"], methods, labels))
    print("\ndiagnostics at the end of the first → last task (mean over seeds)")
    print(diagnostics_table(probe, entry["methods"], methods, labels))


def replot(path: Path, plots: bool = True) -> dict[str, Any]:
    """Print the tables of a saved ``<tag>.json`` and redraw its figures beside it (no training)."""
    results = json.loads(path.read_text())
    print(f"from {path}: {results['command']} ({results['mode']}, {results['date']}, sb3_plastic {results['commit']})")
    for probe, entry in results["probes"].items():
        print_probe(probe, entry, {m: results["methods"][m]["label"] for m in entry["methods"]})
    if plots:
        written = write_figures(results, path.parent, path.stem)
        print("\nwrote " + ", ".join(os.path.relpath(p) for p in written))
    return results


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "sb3_plastic"], cwd=ROOT, capture_output=True, text=True)
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------
def parse_hp(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``method.key=value`` strings to ``{method: {key: value}}`` (values parsed as JSON when possible)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        try:
            target, value = item.split("=", 1)
            method, key = target.split(".", 1)
        except ValueError as exc:
            raise SystemExit(f"--hp expects method.key=value, got {item!r}") from exc
        if method not in METHODS:
            raise SystemExit(f"--hp: unknown method {method!r}; known: {list(METHODS)}")
        try:
            parsed: Any = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        out.setdefault(method, {})[key] = parsed
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few tasks, short tasks, 2 seeds (~1-2 minutes)")
    parser.add_argument("--seeds", type=int, default=None, help=f"seeds 0..N-1 (default {FULL_SEEDS}; quick {QUICK_SEEDS})")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per probe (default: the probe's n_tasks)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per task, every probe (default: the probe's)")
    parser.add_argument("--probes", nargs="+", default=list(PROBES), choices=list(PROBES))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--hp", nargs="*", default=[], metavar="METHOD.KEY=VALUE", help="override a method's setting")
    parser.add_argument("--lr", type=float, default=None, help="learning rate of every method and probe")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument(
        "--tag",
        default=None,
        help="output file stem (default: supervised; supervised_quick with --quick, so that a quick run "
        "never overwrites the full run's files)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (default 1; same results)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu; the networks are tiny)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG files")
    parser.add_argument("--replot", type=Path, metavar="JSON", help="print the tables and redraw the PNGs of a saved run")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.replot is not None:
        return replot(args.replot, plots=not args.no_plot)
    th.set_num_threads(args.threads)
    device = th.device(args.device)
    overrides = parse_hp(args.hp)
    n_seeds = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else FULL_SEEDS)
    settings = {m: method_settings(m, overrides) for m in args.methods}
    labels = {m: settings[m]["label"] for m in args.methods}
    tag = args.tag or ("supervised_quick" if args.quick else "supervised")
    started = time.perf_counter()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    results: dict[str, Any] = {
        "command": "python bench/supervised.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "mode": "quick" if args.quick else "full",
        "date": stamp,
        "commit": git_commit(),
        "torch": th.__version__,
        "python": platform.python_version(),
        "threads": args.threads,
        "device": str(device),
        "network": NETWORK,
        "methods": settings,
        "probes": {},
    }
    print(
        f"sb3_plastic supervised probes, mode={results['mode']}, seeds={n_seeds}, device={device}, threads={args.threads}, "
        f"torch {th.__version__}, sb3_plastic {results['commit']}, {stamp}",
        flush=True,
    )
    configs: dict[str, dict[str, Any]] = {}
    for probe in args.probes:
        cfg = copy.deepcopy(PROBES[probe])
        if args.quick:
            cfg.update(QUICK_PROBES[probe])
        for key, value in (("n_tasks", args.tasks), ("epochs", args.epochs), ("lr", args.lr)):
            if value is not None:
                cfg[key] = value
        configs[probe] = cfg
    jobs = [(probe, method, seed) for probe in args.probes for method in args.methods for seed in range(n_seeds)]
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}

    def report(job: tuple[str, str, int], run: dict[str, Any]) -> None:
        runs[job] = run
        curve = " ".join(f"{task['accuracy']:.2f}" for task in run["per_task"])
        print(f"  {job[0]} {job[1]} seed {job[2]}: {curve}  ({run['seconds']:.1f} s)", file=sys.stderr, flush=True)

    if args.jobs > 1:
        # one process per run at a time; each run is seeded, so the results equal those of --jobs 1
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
            futures = {
                pool.submit(run_job, probe, configs[probe], method, settings[method], seed, args.threads, args.device): (
                    probe,
                    method,
                    seed,
                )
                for probe, method, seed in jobs
            }
            for future in as_completed(futures):
                report(futures[future], future.result())
    else:
        for probe, method, seed in jobs:
            report(
                (probe, method, seed),
                run_job(probe, configs[probe], method, settings[method], seed, args.threads, args.device),
            )

    keys = CSV_KEYS
    for probe in args.probes:
        cfg = configs[probe]
        per_method: dict[str, dict[str, Any]] = {}
        for method in args.methods:
            entry: dict[str, Any] = {k: [] for k in keys}
            entry.update(seconds=[], steps=[], cbp_replaced=[])
            for seed in range(n_seeds):
                run = runs[(probe, method, seed)]
                for k in keys:
                    entry[k].append([task.get(k, task["accuracy"]) for task in run["per_task"]])
                for k in ("seconds", "steps", "cbp_replaced"):
                    entry[k].append(run[k])
            entry["summary"] = summarise(np.array(entry["accuracy"]))
            per_method[method] = entry
        results["probes"][probe] = {"config": cfg, "seeds": list(range(n_seeds)), "methods": per_method}
        print_probe(probe, results["probes"][probe], labels)
    results["seconds"] = time.perf_counter() - started
    written = write_data(results, args.out, tag)
    if not args.no_plot:
        written += write_figures(results, args.out, tag)
    print(f"\n{results['seconds']:.0f} s; wrote " + ", ".join(os.path.relpath(p) for p in written))
    results["files"] = [str(p) for p in written]
    return results


if __name__ == "__main__":
    main()
