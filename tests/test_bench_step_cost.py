"""bench/step_cost.py: the verdict rule, the flop floor against a hand count, and one tiny measured entry."""

from __future__ import annotations

import copy
import json

import pytest
import torch as th
from bench_modules import load_bench
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env

from sb3_plastic import PlasticDQN

step_cost = load_bench("step_cost")

TINY = dict(learning_rate=1e-3, batch_size=16, learning_starts=32, train_freq=32, gradient_steps=1, buffer_size=1000)


def _tiny(cls, **plastic):
    def build(device, seed):
        env = make_vec_env("CartPole-v1", n_envs=1, seed=seed)
        return cls("MlpPolicy", env, policy_kwargs=dict(net_arch=[8, 8]), device=device, seed=seed, **TINY, **plastic)

    return build


def test_verdict_is_given_only_where_the_band_resolves_it():
    assert step_cost.verdict(0.99, 1.02, 0.95) == "PASS"
    assert step_cost.verdict(0.96, 1.02, 0.95) == "not resolved"
    assert step_cost.verdict(0.90, 1.02, 0.95) == "FAIL"
    assert step_cost.verdict(0.90, 1.10, 0.95) == "not resolved"
    assert step_cost.verdict(0.5, 1.0, None) == "-"


def test_flop_count_of_a_matmul_is_the_hand_count():
    a, b = th.randn(5, 7), th.randn(7, 3)
    assert step_cost.count_flops(lambda: a @ b) == 2 * 5 * 7 * 3


def test_op_count_counts_the_kernels_a_call_dispatches_and_not_its_views():
    a, b = th.randn(5, 7), th.randn(3, 7)
    assert step_cost.count_ops(lambda: (a @ b.t()).relu()) == 2  # mm and relu; the transpose is a view
    assert step_cost.count_ops(lambda: a.view(7, 5)[1:3]) == 0
    assert step_cost.count_ops(lambda: a.sum().item()) == 1  # the read of the scalar launches no kernel
    assert step_cost.count_ops(lambda: [a.add_(1) for _ in range(3)], calls=2) == 3


def test_a_tiny_entry_measures_three_arms_and_the_isometry_step_flops():
    entry = step_cost.Entry("tiny", "PlasticDQN relu vs DQN, [8, 8]", _tiny(DQN), _tiny(PlasticDQN, activation="relu"),
                            target=0.95, warmup=64, gradient_steps=2, batch_size=16)
    res = step_cost.measure(entry, rounds=2, min_run_time=0.01, threads=1, device="cpu", seed=0, log=lambda m: None)
    # the exact step of a weight (m, n) costs 4 m n min(m, n): the hidden weights (8, 4) and (8, 8), not the head
    per_update = 4 * 8 * 4 * 4 + 4 * 8 * 8 * 8
    assert res["flops"]["B"] - res["flops"]["A"] == 2 * per_update
    assert res["floor"] == pytest.approx(res["flops"]["A"] / res["flops"]["B"]) and res["floor"] < 1
    # the launch floor: the step adds kernels of its own to every update of the candidate
    assert res["ops"]["B"] > res["ops"]["A"] > 0
    assert res["op_floor"] == pytest.approx(res["ops"]["A"] / res["ops"]["B"])
    assert "| op floor |" in step_cost.table([res])
    for clock in ("wall", "cpu"):
        assert len(res[clock]["ratios"]) == len(res[clock]["controls"]) == 2
        assert res[clock]["band"] >= 1 and res[clock]["verdict"] in ("PASS", "FAIL", "not resolved")


def test_whole_run_times_one_learn_per_arm_and_round_on_both_clocks():
    entry = step_cost.Entry("tiny", "PlasticDQN relu vs DQN, [8, 8]", _tiny(DQN), _tiny(PlasticDQN, activation="relu"),
                            target=0.95, warmup=64, gradient_steps=2, batch_size=16)
    models = []

    def build(device, seed, _build=entry.baseline):
        models.append(_build(device, seed))
        return models[-1]

    entry = step_cost.Entry(entry.name, entry.description, build, entry.candidate, target=0.95, warmup=64,
                            gradient_steps=2, batch_size=16)
    res = step_cost.measure(entry, rounds=2, min_run_time=0.01, threads=1, device="cpu", seed=0, whole_run=64,
                            log=lambda m: None)
    assert res["work"] == "learn" and res["whole_run_steps"] == 64
    for clock in ("wall", "cpu"):
        for arm in ("A", "A'", "B"):
            assert len(res["times"][arm][clock]) == 2 and all(t > 0 for t in res["times"][arm][clock])
    # both clocks read the same learn() call: each baseline model ran a counted warm-up and 2 rounds of 64 steps
    steps = [m.num_timesteps for m in models]
    assert len(steps) == 2 and steps[0] == steps[1]
    assert steps[0] - step_cost.prepare(entry, entry.baseline, "cpu", 0)[0].num_timesteps == 3 * 64
    # the whole-run floor counts a learn(64): its rollout forwards make the isometry step a smaller share than in
    # one train() call (the train-step floor), and the step's flops are the same per update
    train_floor = step_cost.measure(entry, rounds=2, min_run_time=0.01, threads=1, device="cpu", seed=0,
                                    log=lambda m: None)["floor"]
    assert train_floor < res["floor"] < 1


def test_step_efficiency_times_the_isometry_part_against_its_own_products():
    th.manual_seed(0)
    model = _tiny(PlasticDQN, activation="relu")("cpu", 0)
    model.learn(64)
    work = step_cost.step_efficiency_work(model)
    opt = model.policy.optimizer
    coefs = [g["isometry_coef"] for g in opt.param_groups]
    per_update = 4 * 8 * 4 * 4 + 4 * 8 * 8 * 8  # the hidden weights (8, 4) and (8, 8)
    assert step_cost.count_flops(work["matmul"]) == per_update
    assert step_cost.count_flops(work["on"]) - step_cost.count_flops(work["off"]) == per_update
    assert [g["isometry_coef"] for g in opt.param_groups] == coefs  # "off" puts the coefficients back
    res = step_cost.measure_step_efficiency(model, rounds=2, min_run_time=0.01, threads=1)
    assert set(res["times"]) == {"on", "off", "matmul"} and len(res["efficiency"]) == 2
    parts = [on - off for on, off in zip(res["times"]["on"], res["times"]["off"])]
    assert res["isometry_part"] == parts


def test_step_efficiency_is_not_measured_without_a_per_call_step():
    plain = _tiny(DQN)("cpu", 0)
    auto = _tiny(PlasticDQN, activation="relu", isometry_interval=4)("cpu", 0)
    for model in (plain, auto):
        model.learn(64)
        assert step_cost.step_efficiency_work(model) == {}
        assert step_cost.measure_step_efficiency(model, rounds=2, min_run_time=0.01, threads=1) is None


def test_train_steps_run_with_the_keyword_interventions_active():
    """L2-init's hooks are removed when learn() returns: the timed train() must run with them (prepare starts them)."""
    entry = step_cost.Entry("tiny-l2init", "", _tiny(DQN), _tiny(PlasticDQN, activation="relu", isometry_mode="off",
                                                                  optimizer="adam", l2_init_coef=0.5), warmup=64)
    model, _ = step_cost.prepare(entry, entry.candidate, "cpu", 0)
    (l2init,) = model.step_cost_interventions.callbacks
    params = list(model.policy.q_net.parameters())
    model.policy.set_training_mode(True)
    model.policy.optimizer.zero_grad()
    sum((p * 0.0).sum() for p in params).backward()  # no task gradient: what arrives is the penalty's
    theta0 = l2init.state["theta0"]
    for key, p in l2init.named_network_parameters():
        if key.startswith("q_net."):
            th.testing.assert_close(p.grad, 2 * 0.5 * (p.detach() - theta0[key]))
    assert any(p.grad.abs().sum() > 0 for p in params)  # the warm-up moved the weights away from theta_0
    model.policy.set_training_mode(False)
    plain, _ = step_cost.prepare(entry, entry.baseline, "cpu", 0)
    assert plain.step_cost_interventions is None


def _compiled(fn):
    return hasattr(fn, "_torchdynamo_orig_callable")


def test_compile_train_step_trains_as_the_eager_model():
    """The compiled train step is the same computation: from the same state and the same replay samples, a compiled
    PlasticDQN and an eager one end with the same parameters, and only the compiled one's work is compiled."""
    import numpy as np

    models = []
    for _ in range(2):
        models.append(_tiny(PlasticDQN, activation="relu")("cpu", 0))
        models[-1].learn(64)
    models[1].policy.load_state_dict(models[0].policy.state_dict())
    # a copy: torch's load_state_dict keeps the given state tensors, which the two optimizers would then share
    models[1].policy.optimizer.load_state_dict(copy.deepcopy(models[0].policy.optimizer.state_dict()))
    step_cost.compile_train_step(models[1])
    assert _compiled(models[1].policy.optimizer.step) and not _compiled(models[0].policy.optimizer.step)
    assert models[1].policy.q_net._compiled_call_impl is not None and models[0].policy.q_net._compiled_call_impl is None
    before = [p.detach().clone() for p in models[1].policy.q_net.parameters()]
    for _ in range(3):
        for model in models:
            np.random.seed(5)  # the replay buffer samples from numpy's global generator
            model.train(gradient_steps=2, batch_size=16)
    for a, b in zip(models[0].policy.parameters(), models[1].policy.parameters()):
        th.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(not th.equal(b, p) for b, p in zip(before, models[1].policy.q_net.parameters()))  # it trained


def test_a_compiled_candidate_is_warm_before_the_rounds_and_its_flops_are_counted_eager():
    models = {}

    def builder(cls, key, **plastic):
        def build(device, seed):
            models.setdefault(key, []).append(_tiny(cls, **plastic)(device, seed))
            return models[key][-1]

        return build

    entry = step_cost.Entry("tiny", "", builder(DQN, "A"), builder(PlasticDQN, "B", activation="relu"), target=0.95,
                            warmup=64, gradient_steps=2, batch_size=16)
    res = step_cost.measure(entry, rounds=2, min_run_time=0.01, threads=1, device="cpu", seed=0, log=lambda m: None,
                            compile="candidate")
    assert res["compile"] == "candidate" and res["compiled_arms"] == ["B"] and res["compiled_during_rounds"] == 0
    (candidate,) = models["B"]
    assert _compiled(candidate.policy.optimizer.step)
    assert not any(_compiled(m.policy.optimizer.step) for m in models["A"])
    eager = step_cost.measure(entry, rounds=2, min_run_time=0.01, threads=1, device="cpu", seed=0, log=lambda m: None)
    assert res["flops"] == eager["flops"] and res["flops"]["B"] > res["flops"]["A"] > 0
    with pytest.raises(ValueError, match="train-step entries only"):
        step_cost.measure(entry, rounds=2, min_run_time=0.01, threads=1, device="cpu", seed=0, whole_run=64,
                          compile="all")
    with pytest.raises(ValueError, match="compile must be one of"):
        step_cost.measure(entry, rounds=2, min_run_time=0.01, threads=1, device="cpu", seed=0, compile="yes")


def test_both_clocks_wait_for_the_accelerator(monkeypatch):
    # torch's Timer synchronises a GPU only through its default clock: one passed explicitly (timeit.default_timer)
    # times kernel launches. Every clock of the bench must wait for the device's queued work before it reads.
    synced = []
    monkeypatch.setattr(th.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(th.accelerator, "synchronize", lambda *a, **k: synced.append(1))
    for clock in ("wall", "cpu"):
        before = len(synced)
        step_cost.CLOCKS[clock]()
        assert len(synced) == before + 1, clock


def test_the_json_keeps_every_finished_entry_when_a_run_is_cut_short(tmp_path, monkeypatch):
    tiny = step_cost.Entry("tiny", "PlasticDQN relu vs DQN, [8, 8]", _tiny(DQN), _tiny(PlasticDQN, activation="relu"),
                           target=0.95, warmup=64, gradient_steps=2, batch_size=16)

    def broken(device, seed):
        raise KeyboardInterrupt  # what a timeout's signal or Ctrl-C does in the middle of a run

    monkeypatch.setitem(step_cost.REGISTRY, "tiny", tiny)
    monkeypatch.setitem(step_cost.REGISTRY, "broken", step_cost.Entry("broken", "", broken, broken, target=None))
    out = tmp_path / "cost.json"
    with pytest.raises(KeyboardInterrupt):
        step_cost.main(["--only", "tiny", "broken", "--rounds", "2", "--min-run-time", "0.01", "--json", str(out)])
    cut = json.loads(out.read_text())
    assert not cut["complete"] and [r["entry"] for r in cut["results"]] == ["tiny"] and cut["device"] == "cpu"
    assert step_cost.main(["--only", "tiny", "--rounds", "2", "--min-run-time", "0.01", "--json", str(out)]) == 0
    done = json.loads(out.read_text())
    assert done["complete"] and len(done["results"]) == 1 and len(done["results"][0]["cpu"]["ratios"]) == 2


def test_adam_foreach_makes_adam_dispatch_its_ops_once_for_all_parameters_and_is_undone():
    th.manual_seed(0)

    def step_ops(n_params: int, foreach_on: bool) -> float:
        params = [th.nn.Parameter(th.randn(4, 3)) for _ in range(n_params)]
        for p in params:
            p.grad = th.randn_like(p)
        with step_cost.adam_foreach(foreach_on):
            opt = th.optim.Adam(params, lr=1e-3)
            opt.step()  # the first step also builds the state
            return step_cost.count_ops(opt.step)

    # the loop dispatches its elementwise ops once per parameter; foreach once for all of them
    assert step_ops(6, False) > step_ops(3, False)
    assert step_ops(6, True) == step_ops(3, True) < step_ops(3, False)
    loop = step_ops(3, False)
    assert step_ops(3, False) == loop  # the patch was undone on leaving


def test_count_only_counts_both_floors_and_times_nothing(tmp_path, monkeypatch, capsys):
    entry = step_cost.Entry("tiny", "PlasticDQN relu vs DQN, [8, 8]", _tiny(DQN), _tiny(PlasticDQN, activation="relu"),
                            target=0.95, warmup=64, gradient_steps=2, batch_size=16)
    monkeypatch.setitem(step_cost.REGISTRY, "tiny", entry)
    monkeypatch.setattr(step_cost, "_time", lambda *a, **k: pytest.fail("--count-only timed something"))
    out = tmp_path / "count.json"
    assert step_cost.main(["--count-only", "--only", "tiny", "--json", str(out)]) == 0
    loop = json.loads(out.read_text())["results"][0]
    assert step_cost.main(["--count-only", "--adam-foreach", "--only", "tiny", "--json", str(out)]) == 0
    foreach = json.loads(out.read_text())
    assert foreach["adam_foreach"] is True
    foreach = foreach["results"][0]
    # the flops do not depend on Adam's implementation; the plain arm's kernels do (one per op for all parameters)
    assert foreach["flops"] == loop["flops"]
    assert foreach["ops"]["A"] < loop["ops"]["A"]
    assert loop["op_floor"] == pytest.approx(loop["ops"]["A"] / loop["ops"]["B"]) and loop["op_floor"] < 1
    assert "| tiny | train |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        step_cost.main(["--adam-foreach", "--only", "tiny"])
