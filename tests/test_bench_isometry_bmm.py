"""bench/isometry_bmm_compile.py times the library's update: its per-weight function against AdamO's own step, and
its batched form against the per-weight one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch as th

from sb3_plastic import AdamO

_BENCH = Path(__file__).resolve().parent.parent / "bench"
_SPEC = importlib.util.spec_from_file_location("bench_isometry_bmm", _BENCH / "isometry_bmm_compile.py")
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


def test_the_timed_update_is_adamos_and_the_batched_one_equals_it():
    th.manual_seed(0)
    weights = [th.randn(32, 4), th.randn(32, 32) / 4, th.randn(1, 32) / 4]
    for w in weights:
        p = th.nn.Parameter(w.clone())
        p.grad = th.zeros_like(p)  # Adam's part moves nothing: the step is the isometry update alone
        AdamO([p], lr=1e-3, isometry_coef=0.3).step()
        assert th.allclose(w - p.detach(), bench.update_one(w, limit=3e-4), atol=1e-7, rtol=1e-5)
    pair = [th.randn(32, 32) / 4, th.randn(32, 32) / 2]
    for u, w in zip(bench.update_batched(pair), pair):
        assert th.allclose(u, bench.update_one(w), atol=1e-7, rtol=1e-5)
