"""The singular values of a policy's feature layers (bench/README.md, the card's section: "which half of the hold costs
the speed"): the largest, median and smallest singular value of each weight of a saved model's features extractor
(a conv kernel viewed as ``(out, in * kh * kw)``), how many lie below 1 (what ``isometry_side="floor"`` would act on
at ``s = 1``) and the DfI's parts from those below and those above 1 (twice what the floor / the ceiling penalises).
Two sources:

* a saved model zip, also one committed earlier (``REV:PATH``, read with ``git show``)::

      python bench/layer_spectrum.py 2bab8db:bench/results/continual/minatar_intensive/ckpt/ppo/s0/step1848320/model.zip

* a method of ``bench/continual.py`` trained here on one task of a setting, the spectra every ``--every`` env steps
  (the same agent and seed as the ``--tasks 1`` runs of that folder)::

      python bench/layer_spectrum.py --train ppo --setting minatar_intensive --seed 0
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import zipfile
from typing import Any, Optional

import torch as th

from sb3_plastic.isometry import deviation_from_isometry_sides

#: the weights read: the shared features extractor's (SB3 also stores the pi_/vf_ copies of a shared one)
PREFIX = "features_extractor."


def spectrum_rows(state_dict: dict[str, th.Tensor], prefix: str = PREFIX) -> list[dict[str, Any]]:
    """One row per weight (>= 2 dims) whose name starts with ``prefix``: ``name``, ``shape``, ``max``, ``median`` (the
    lower median, ``torch.median``'s), ``min``, ``below_one`` (the count of singular values < 1) and the DfI's two
    parts at target 1, ``dfi_floor`` / ``dfi_ceiling`` (``sum (sigma^2 - 1)^2`` over the singular values below / above
    1: :func:`sb3_plastic.isometry.deviation_from_isometry_sides`, the monitor's keys of those names).

    :raises ValueError: where no weight matches ``prefix`` (naming the keys there are)."""
    rows = []
    for name, w in state_dict.items():
        if not name.startswith(prefix) or w.dim() < 2:
            continue
        s = th.linalg.svdvals(w.detach().double().reshape(w.shape[0], -1))
        floor, ceiling = deviation_from_isometry_sides(w)
        rows.append(dict(name=name, shape=tuple(w.shape), max=float(s.max()), median=float(s.median()),
                         min=float(s.min()), below_one=int((s < 1).sum()), dfi_floor=floor, dfi_ceiling=ceiling))
    if not rows:
        raise ValueError(f"no weight named {prefix}* with >= 2 dims; the keys: {sorted(state_dict)[:20]}")
    return rows


def read_policy(source: str) -> dict[str, th.Tensor]:
    """The policy's state dict from a model zip: a file path, or ``REV:PATH`` of a file committed in this git
    repository (``git show``)."""
    if os.path.exists(source):
        with open(source, "rb") as f:
            data = f.read()
    else:
        rev, sep, path = source.partition(":")
        if not sep:
            raise ValueError(f"{source!r} is neither a file nor REV:PATH")
        data = subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True).stdout
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return th.load(io.BytesIO(z.read("policy.pth")), map_location="cpu", weights_only=True)


def format_rows(rows: list[dict[str, Any]], label: str = "") -> str:
    """One line per row: ``label name shape: max / median / min, n below 1, DfI below / above 1``."""
    return "\n".join(f"{label}{r['name']} {r['shape']}: max {r['max']:.2f}, median {r['median']:.2f}, "
                     f"min {r['min']:.3f}, {r['below_one']} below 1, DfI below / above 1: {r['dfi_floor']:.3g} / "
                     f"{r['dfi_ceiling']:.3g}" for r in rows)


def train_and_print(method: str, setting_name: str, seed: int, every: int, prefix: str = PREFIX) -> None:
    """Train ``method`` on the first task of ``setting_name`` (``bench/continual.py``'s agent for ``seed``) and print
    the spectra of the weights named ``prefix*`` at the end of the first rollout past every ``every`` env steps (before
    its update) and after the last update."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import continual
    from stable_baselines3.common.callbacks import BaseCallback

    setting = continual.SETTINGS[setting_name]
    model, callbacks = continual.build_model(method, setting, continual.MethodParams(), seed, "cpu", None)
    steps = setting.change_every * setting.n_envs

    class Spectra(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_at = 0

        def _on_rollout_end(self) -> None:
            if self.num_timesteps >= self.next_at:
                print(format_rows(spectrum_rows(self.model.policy.state_dict(), prefix), f"{self.num_timesteps:>8} "),
                      flush=True)
                self.next_at += every

        def _on_step(self) -> bool:
            return True

    model.learn(steps, callback=[Spectra(), *callbacks])
    # the callback reads each rollout's end, before its update: the weights after the last update, labelled apart
    print(format_rows(spectrum_rows(model.policy.state_dict(), prefix), f"{model.num_timesteps:>8} (after the last update) "))


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="*", help="model zips: file paths or REV:PATH")
    parser.add_argument("--train", metavar="METHOD", help="train this bench/continual.py method on one task instead")
    parser.add_argument("--setting", default="minatar_intensive")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=50_000, help="env steps between prints with --train")
    parser.add_argument("--prefix", default=PREFIX, help=f"the weights read, from zips or with --train (default {PREFIX})")
    args = parser.parse_args(argv)
    if args.train:
        th.set_num_threads(1)
        train_and_print(args.train, args.setting, args.seed, args.every, args.prefix)
    if not args.train and not args.sources:
        parser.error("give model zips or --train METHOD")
    for source in args.sources:
        print(source)
        print(format_rows(spectrum_rows(read_policy(source), args.prefix), "  "))


if __name__ == "__main__":
    main()
