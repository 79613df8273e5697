"""``sb3-plastic plot`` groups runs by method (run metadata, or the run folder without it), never merging two
algorithms; filters that match nothing are errors; condition numbers go on a log axis (issue #12, item 5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch as th
from builders import write_run
from stable_baselines3 import PPO

from sb3_plastic import PlasticPPO, cli
from sb3_plastic.callbacks import FIRE
from sb3_plastic.plot import (
    PlotError,
    fallback_group,
    groups,
    load_runs,
    metric_figure,
    plot_runs,
    returns_figure,
    y_scale,
)
from sb3_plastic.run_info import RUN_INFO_FILE, RunInfoCallback, read_run_info


def meta(algo: str, seed: int, env_id: str = "CartPole-v1", **hyper) -> dict:
    base = dict(learning_rate=3e-4, n_steps=64, net_arch=[64, 64])
    return dict(format=1, algo=algo, zoo_algo=None, env_id=env_id, seed=seed, hyperparameters=dict(base, **hyper))


RETURNS = {"rollout/ep_rew_mean": [10.0, 20.0, 30.0]}


@pytest.fixture
def zoo_layout(tmp_path) -> Path:
    """``sb3-plastic train -tb runs/`` layout: ``runs/CartPole-v1/PPO_<n>`` for PlasticPPO (two settings of
    isometry_coef, two seeds of one) and plain PPO; the seeds also differ in a seed-like key."""
    env_dir = tmp_path / "runs" / "CartPole-v1"
    write_run(env_dir / "PPO_1", RETURNS, meta("PlasticPPO", 0, isometry_coef=0.1, task_seed=0))
    write_run(env_dir / "PPO_2", RETURNS, meta("PlasticPPO", 1, isometry_coef=0.1, task_seed=1))
    write_run(env_dir / "PPO_3", RETURNS, meta("PlasticPPO", 0, isometry_coef=1.0, task_seed=0))
    write_run(env_dir / "PPO_4", RETURNS, meta("PPO", 0, task_seed=0))
    return tmp_path / "runs"


def group_sizes(runs) -> dict[str, int]:
    return {name: len(members) for name, members in groups(runs).items()}


def test_methods_with_metadata_are_separate_groups(zoo_layout):
    runs = load_runs([str(zoo_layout)])
    # algorithm + the hyperparameters that differ within it (seed and task_seed excluded)
    assert group_sizes(runs) == {"PPO": 1, "PlasticPPO isometry_coef=0.1": 2, "PlasticPPO isometry_coef=1": 1}
    _, ax = returns_figure(runs)
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["PPO (1 seed)", "PlasticPPO isometry_coef=0.1 (2 seeds)", "PlasticPPO isometry_coef=1 (1 seed)"]


def test_environment_is_part_of_the_group_when_runs_cover_several(tmp_path):
    write_run(tmp_path / "a" / "PPO_1", RETURNS, meta("PlasticPPO", 0, env_id="CartPole-v1"))
    write_run(tmp_path / "b" / "PPO_1", RETURNS, meta("PlasticPPO", 0, env_id="Acrobot-v1"))
    assert group_sizes(load_runs([str(tmp_path)])) == {"PlasticPPO Acrobot-v1": 1, "PlasticPPO CartPole-v1": 1}


def test_runs_without_metadata_group_by_run_folder(tmp_path):
    env_dir = tmp_path / "runs" / "CartPole-v1"
    for name in ("PPO_1", "PPO_2", "DQN_1"):
        write_run(env_dir / name, RETURNS)
    runs = load_runs([str(tmp_path / "runs")])
    assert group_sizes(runs) == {"CartPole-v1/DQN": 1, "CartPole-v1/PPO": 2}
    assert all(r.info is None for r in runs)
    # seed parts of SB3 tb_log_names are not methods
    assert fallback_group("/x/logs/ppo_relu/seed0_1") == "ppo_relu"
    assert fallback_group("/x/runs/Pendulum-v1/SAC_seed3_12") == "Pendulum-v1/SAC"


def test_group_by_overrides_and_must_match(zoo_layout, tmp_path):
    runs = load_runs([str(zoo_layout)], group_by=r"(CartPole)")
    assert group_sizes(runs) == {"CartPole": 4}
    with pytest.raises(PlotError, match=r"group_by 'nomatch_\(x\)' matches none of the 4 run paths: .*PPO_1"):
        load_runs([str(zoo_layout)], group_by=r"nomatch_(x)")
    with pytest.raises(PlotError, match="not a regular expression"):
        load_runs([str(zoo_layout)], group_by="(unclosed")
    with pytest.warns(UserWarning, match="does not match 3 of 4 runs"):
        runs = load_runs([str(zoo_layout)], group_by=r"PPO_4")
    assert group_sizes(runs) == {"PPO_4": 1, "PlasticPPO isometry_coef=0.1": 2, "PlasticPPO isometry_coef=1": 1}


def test_bad_metrics_and_return_tag_are_errors(tmp_path):
    write_run(tmp_path / "runs" / "PPO_1", {**RETURNS, "plasticity/policy/ntk_cond": [2.0, 3.0, 4.0], "train/loss": [1, 2, 3]})
    out = tmp_path / "plots"
    missing = r"metrics pattern 'plasticity/\*/srank' matches no scalar tag.*plasticity/policy/ntk_cond"
    with pytest.raises(PlotError, match=missing):
        plot_runs([str(tmp_path / "runs")], str(out), metrics=["plasticity/*/srank"])
    # one of several patterns matching nothing is enough
    with pytest.raises(PlotError, match=r"patterns \['nope', 'x/\*\*'\] match"):
        plot_runs([str(tmp_path / "runs")], str(out), metrics=["plasticity/*/ntk_cond", "nope", "x/**"])
    with pytest.raises(PlotError, match=r"return_tag 'rollout/ep_return' .* look like returns: rollout/ep_rew_mean"):
        plot_runs([str(tmp_path / "runs")], str(out), return_tag="rollout/ep_return")
    with pytest.raises(PlotError, match="switch_every must be a positive integer"):
        plot_runs([str(tmp_path / "runs")], str(out), switch_every=0)
    assert not out.exists()  # nothing written before the request was checked
    written = plot_runs([str(tmp_path / "runs")], str(out), metrics=["plasticity/*/ntk_cond"])
    assert sorted(Path(p).name for p in written) == ["metric_plasticity__policy__ntk_cond.png", "return_curve.png"]


def test_default_return_tag_missing_is_a_warning_not_an_error(tmp_path):
    write_run(tmp_path / "runs" / "PPO_1", {"plasticity/policy/ntk_cond": [2.0, 3.0, 4.0]})
    with pytest.warns(UserWarning, match="no run logs the return tag 'rollout/ep_rew_mean'"):
        written = plot_runs([str(tmp_path / "runs")], str(tmp_path / "plots"))
    assert [Path(p).name for p in written] == ["metric_plasticity__policy__ntk_cond.png"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--metrics", "plasticity/*/srank"], "metrics pattern 'plasticity/*/srank' matches no scalar tag"),
        (["--return-tag", "rollout/nope"], "return_tag 'rollout/nope' is logged by none of the 1 runs"),
        (["--group-by", "zzz"], "group_by 'zzz' matches none of the 1 run paths"),
    ],
)
def test_cli_bad_filters_exit_nonzero_with_message(tmp_path, capsys, extra, message):
    write_run(tmp_path / "runs" / "PPO_1", RETURNS)
    assert cli.main(["plot", str(tmp_path / "runs"), "--out", str(tmp_path / "plots"), *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sb3-plastic plot: error: ") and message in err
    assert "Traceback" not in err


def test_cli_prints_warnings_plainly(tmp_path, capsys):
    write_run(tmp_path / "runs" / "PPO_1", {"plasticity/policy/ntk_cond": [2.0, 3.0, 4.0]})
    assert cli.main(["plot", str(tmp_path / "runs"), "--out", str(tmp_path / "plots")]) == 0
    captured = capsys.readouterr()
    assert "sb3-plastic plot: warning: no run logs the return tag" in captured.err
    assert captured.out.split() == [str(tmp_path / "plots" / "metric_plasticity__policy__ntk_cond.png")]


def test_plastic_learn_writes_run_metadata(tmp_path):
    th.set_num_threads(1)
    model = PlasticPPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=32,
        batch_size=16,
        n_epochs=1,
        learning_rate=1e-3,
        activation="maxmin",
        isometry_coef=0.5,
        replacement_rate=1e-3,
        seed=7,
        tensorboard_log=str(tmp_path / "tb"),
        policy_kwargs=dict(net_arch=[8]),
    )
    assert not (tmp_path / "tb").exists()
    model.learn(32, callback=FIRE(at=0.5))
    run_dir = tmp_path / "tb" / "PPO_1"  # SB3's tb_log_name of the plastic classes is their base's
    info = read_run_info(str(run_dir))
    assert info is not None
    assert (info["format"], info["algo"], info["env_id"], info["seed"]) == (1, "PlasticPPO", "CartPole-v1", 7)
    hyper = info["hyperparameters"]
    expected = dict(
        n_steps=32,
        batch_size=16,
        n_epochs=1,
        learning_rate=1e-3,
        gamma=0.99,
        clip_range=0.2,
        ent_coef=0.0,
        net_arch=[8],
        activation="maxmin",
        isometry_coef=0.5,
        optimizer="adamo",
        replacement_rate=1e-3,
        fire_at=None,
        callbacks="FIRE",
    )
    assert {k: hyper.get(k) for k in expected} == expected
    assert hyper["FIRE.at"] == 0.5 and hyper["FIRE.on_task_change"] is False
    assert "seed" not in hyper and "verbose" not in hyper and "tensorboard_log" not in hyper
    # the keyword-enabled CBP callback is in the keywords, not listed again as a callback
    assert hyper["callbacks"] == "FIRE"


def test_run_info_callback_for_plain_sb3_and_grouping_of_real_runs(tmp_path):
    th.set_num_threads(1)
    kwargs = dict(n_steps=32, batch_size=16, n_epochs=1, policy_kwargs=dict(net_arch=[8]))
    tb = tmp_path / "tb" / "CartPole-v1"
    plain = PPO("MlpPolicy", "CartPole-v1", seed=1, tensorboard_log=str(tb), **kwargs)
    callback = RunInfoCallback(zoo_algo="ppo")
    plain.learn(32, callback=callback)
    assert callback.path == str(tb / "PPO_1" / RUN_INFO_FILE)
    info = read_run_info(str(tb / "PPO_1"))
    assert (info["algo"], info["zoo_algo"], info["seed"]) == ("PPO", "ppo", 1)
    assert info["hyperparameters"]["n_steps"] == 32 and info["hyperparameters"]["activation_fn"] == "Tanh"
    for seed in (1, 2):
        PlasticPPO("MlpPolicy", "CartPole-v1", seed=seed, tensorboard_log=str(tb), **kwargs).learn(32)
    runs = load_runs([str(tmp_path / "tb")])
    assert sorted(Path(r.path).name for r in runs) == ["PPO_1", "PPO_2", "PPO_3"]
    assert group_sizes(runs) == {"PPO": 1, "PlasticPPO": 2}
    # without TensorBoard output nothing is written, and the callback says so through its path
    quiet = RunInfoCallback()
    PPO("MlpPolicy", "CartPole-v1", seed=1, **kwargs).learn(32, callback=quiet)
    assert quiet.path is None


def test_condition_numbers_get_a_log_axis(tmp_path):
    narrow = [2.0, 3.0, 4.0]  # one decade or less: a "wide range" rule alone would keep a linear axis
    write_run(
        tmp_path / "PPO_1",
        {
            "plasticity/policy/ntk_cond": narrow,
            "plasticity/policy/ntk_log10_cond": list(np.log10(narrow)),
            "plasticity/policy/mlp_extractor.policy_net.0/cond": narrow,
            "plasticity/policy/weight_norm": narrow,
            "plasticity/policy/dfi": [1e-3, 1.0, 10.0],
        },
    )
    runs = load_runs([str(tmp_path)])
    scales = {}
    for tag in ("ntk_cond", "ntk_log10_cond", "mlp_extractor.policy_net.0/cond", "weight_norm", "dfi"):
        _, ax = metric_figure(runs, f"plasticity/policy/{tag}")
        scales[tag] = ax.get_yscale()
        if tag == "ntk_log10_cond":
            assert ax.get_ylabel() == "log10 of the NTK condition number (λmax / λmin)"
        if tag == "ntk_cond":
            assert ax.get_ylabel().endswith("(log scale)")
    assert scales == {
        "ntk_cond": "log",
        "ntk_log10_cond": "linear",
        "mlp_extractor.policy_net.0/cond": "log",
        "weight_norm": "linear",
        "dfi": "log",
    }
    assert metric_figure(runs, "plasticity/policy/absent") is None
    assert y_scale("plasticity/policy/ntk_cond", np.array([np.inf, np.nan])) == "linear"


def test_zoo_runs_of_two_algorithms_in_one_env_folder_are_two_groups(tmp_path, monkeypatch):
    """``sb3-plastic train -tb tb`` of ppo and plastic_ppo: both write ``tb/CartPole-v1/PPO_<n>`` (the old
    default grouped both under ``CartPole-v1``); the metadata names the algorithms and rl_zoo3's log folder."""
    from sb3_plastic import zoo

    monkeypatch.chdir(tmp_path)
    quick = ["--env", "CartPole-v1", "-n", "64", "-tb", "tb", "-f", "logs", "--eval-freq", "-1", "--seed", "0"]
    params = ["-params", "n_envs:1", "n_steps:32", "batch_size:32", "n_epochs:1"]
    for algo in ("ppo", "plastic_ppo"):
        zoo.train(["--num-threads", "1", "--verbose", "0", "--algo", algo, *quick, *params])
    infos = {name: read_run_info(str(tmp_path / "tb" / "CartPole-v1" / name)) for name in ("PPO_1", "PPO_2")}
    found = [(i["algo"], i["zoo_algo"], i["seed"]) for i in infos.values()]
    assert found == [("PPO", "ppo", 0), ("PlasticPPO", "plastic_ppo", 0)]
    assert infos["PPO_2"]["zoo_log_dir"] == str(tmp_path / "logs" / "plastic_ppo" / "CartPole-v1_1" / "CartPole-v1")
    assert infos["PPO_2"]["hyperparameters"]["n_steps"] == 32
    assert group_sizes(load_runs([str(tmp_path / "tb")])) == {"PPO": 1, "PlasticPPO": 1}


def test_runs_of_several_envs_get_a_figure_set_each_with_legends_inside_and_no_warnings(tmp_path):
    """Issue #31: the README's plot command drew CartPole, MinAtar and HalfCheetah on one axis, legend labels without
    the env clipped off the figure, and 12 constrained_layout warnings."""
    import warnings

    from sb3_plastic.plot import _finish

    long = dict(policy_kwargs="dict(log_std_init=-2, ortho_init=False, activation_fn=nn.ReLU, net_arch=[256, 256])")
    envs = {"CartPole-v1": dict(n_steps=32, gamma=0.98), "MinAtar/Breakout-v1": dict(n_steps=128, gamma=0.99, **long),
            "sb3_plastic/SlipperyHalfCheetah-v0": dict(n_steps=512, gamma=0.9, normalize=True, **long)}
    scalars = dict(RETURNS, **{"plasticity/policy/ntk_cond": [1.0, 10.0, 100.0]})
    for k, (env, hyper) in enumerate(envs.items()):
        for seed in (0, 1):
            write_run(tmp_path / "runs" / f"env{k}" / f"PPO_{seed + 1}", scalars, meta("PlasticPPO", seed, env, **hyper))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = plot_runs([str(tmp_path / "runs")], str(tmp_path / "plots"))
        together = plot_runs([str(tmp_path / "runs")], str(tmp_path / "together"), split_envs=False)
    assert sorted(str(Path(p).relative_to(tmp_path / "plots")) for p in written) == sorted(
        f"{folder}/{name}"
        for folder in ("CartPole-v1", "MinAtar__Breakout-v1", "sb3_plastic__SlipperyHalfCheetah-v0")
        for name in ("return_curve.png", "metric_plasticity__policy__ntk_cond.png")
    )
    assert sorted(Path(p).name for p in together) == ["metric_plasticity__policy__ntk_cond.png", "return_curve.png"]
    runs = load_runs([str(tmp_path / "runs")])
    for env in envs:  # one env: its title names it, one method (its two seeds), no hyperparameter soup
        mine = [r for r in runs if r.info["env_id"] == env]
        from sb3_plastic.plot import assign_groups

        assign_groups(mine)
        fig, ax = returns_figure(mine)
        assert f"on {env}" in ax.get_title() and ax.get_legend_handles_labels()[1] == ["PlasticPPO (2 seeds)"]
    fig, ax = returns_figure(load_runs([str(tmp_path / "runs")]))  # all envs on one axis (--together): env in labels
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _finish(fig, ax, str(tmp_path / "all.png"))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert all(any(env in label for env in envs) for label in labels)
    renderer = fig.canvas.get_renderer()
    legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert axes.x0 - 1 <= legend.x0 and legend.x1 <= axes.x1 + 1 and axes.y0 - 1 <= legend.y0 and legend.y1 <= axes.y1 + 1


def test_plot_cli_together_option(tmp_path, capsys):
    for k, env in enumerate(("CartPole-v1", "Acrobot-v1")):
        write_run(tmp_path / "runs" / f"e{k}" / "PPO_1", dict(RETURNS, **{"plasticity/q/grad_norm": [1.0, 2, 3]}),
                  meta("PPO", 0, env))
    assert cli.main(["plot", str(tmp_path / "runs"), "--out", str(tmp_path / "split")]) == 0
    assert (tmp_path / "split" / "Acrobot-v1" / "return_curve.png").exists()
    assert cli.main(["plot", str(tmp_path / "runs"), "--out", str(tmp_path / "one"), "--together"]) == 0
    assert (tmp_path / "one" / "return_curve.png").exists()
    assert "warning" not in capsys.readouterr().err


def test_runs_without_metadata_stay_with_the_one_known_env(tmp_path):
    """Runs without metadata have no known env: next to one known env they stay in the same figures (no split); next to
    two they get their own folder."""
    write_run(tmp_path / "runs" / "a" / "PPO_1", RETURNS, meta("PlasticPPO", 0, "CartPole-v1"))
    write_run(tmp_path / "runs" / "b" / "PPO_1", RETURNS)  # a plain SB3 run: no metadata
    written = plot_runs([str(tmp_path / "runs")], str(tmp_path / "one"))
    assert [Path(p).relative_to(tmp_path / "one").as_posix() for p in written] == ["return_curve.png"]
    write_run(tmp_path / "runs" / "c" / "PPO_1", RETURNS, meta("PlasticPPO", 0, "Acrobot-v1"))
    written = plot_runs([str(tmp_path / "runs")], str(tmp_path / "three"))
    assert sorted(Path(p).relative_to(tmp_path / "three").as_posix() for p in written) == [
        "Acrobot-v1/return_curve.png", "CartPole-v1/return_curve.png", "no_run_metadata/return_curve.png"
    ]
