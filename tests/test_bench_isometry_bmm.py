"""bench/isometry_bmm_compile.py times the library's update: the per-weight arm is what AdamO's step subtracts, the
batched arm gives the same updates."""

from __future__ import annotations

import torch as th
from bench_modules import load_bench

from sb3_plastic import AdamO

bench = load_bench("isometry_bmm_compile")


def test_the_timed_update_is_adamos_and_the_batched_one_equals_it():
    th.manual_seed(0)
    weights = [th.randn(32, 4), th.randn(32, 32) / 4, th.randn(1, 32) / 4]
    group = bench.GROUP
    for w in weights:
        p = th.nn.Parameter(w.clone())
        p.grad = th.zeros_like(p)  # Adam's part moves nothing: the step is the isometry update alone
        AdamO([p], lr=group["lr"], isometry_coef=group["isometry_coef"]).step()
        # p - update, read back as a difference: equal up to the rounding of that subtraction
        assert th.allclose(w - p.detach(), bench.update_one(w), atol=1e-6, rtol=1e-4)
    for shape in [(32, 32), (32, 4), (1, 32)]:
        pair = [th.randn(shape) / 4, th.randn(shape) / 2]
        for u, w in zip(bench.update_batched(pair), pair):
            assert u.shape == w.shape
            assert th.allclose(u, bench.update_one(w), atol=1e-8, rtol=1e-5)
