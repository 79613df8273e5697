"""Audit of ``sb3-plastic plot``: a named monitor's diagnostics get figures and labels; default patterns that match
nothing say so; curve tails never average fewer runs than the legend says."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from builders import write_run

from sb3_plastic.plot import PlotError, describe_tag, load_runs, metric_figure, plot_runs, returns_figure

RETURNS = {"rollout/ep_rew_mean": [10.0, 20.0, 30.0]}


def recorded(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught]


def test_a_named_monitors_diagnostics_get_default_figures(tmp_path):
    named = {
        "plasticity/mon/q_net/dormant_fraction": [0.1, 0.2, 0.3],
        "plasticity/mon/q_net/ntk_cond": [1.0, 10.0, 100.0],
        "plasticity/mon/q_net/q_net.0/dormant_fraction": [0.0, 0.1, 0.2],  # a layer: not a default figure
        "plasticity/mon/monitor_seconds": [0.1, 0.2, 0.3],
    }
    write_run(tmp_path / "runs" / "env" / "DQN_1", dict(RETURNS, **named))
    written, messages = recorded(plot_runs, [str(tmp_path / "runs")], str(tmp_path / "out"))
    names = {Path(p).name for p in written}
    assert "metric_plasticity__mon__q_net__dormant_fraction.png" in names
    assert "metric_plasticity__mon__q_net__ntk_cond.png" in names
    assert not any("q_net.0" in n for n in names)
    assert not any("default" in m for m in messages)
    runs = load_runs([str(tmp_path / "runs")])
    _, ax = metric_figure(runs, "plasticity/mon/q_net/dormant_fraction")
    assert "monitor 'mon', network 'q_net'" in ax.get_title() and "layer" not in ax.get_title()


def test_describe_tag_with_and_without_a_monitor_name():
    assert describe_tag("plasticity/q_net/ntk_cond")[1] == "network 'q_net'"
    assert describe_tag("plasticity/q_net/q_net.0/srank")[1] == "network 'q_net', layer 'q_net.0'"
    assert describe_tag("plasticity/mon/q_net/q_net.0/srank")[1] == "monitor 'mon', network 'q_net', layer 'q_net.0'"
    named = ["plasticity/mon"]
    assert describe_tag("plasticity/mon/q_net/ntk_cond", named)[1] == "monitor 'mon', network 'q_net'"
    assert describe_tag("plasticity/q_net/q_net.0/srank", ["plasticity"])[1] == "network 'q_net', layer 'q_net.0'"


def test_unnamed_monitor_layer_tags_stay_out_of_the_default_figures(tmp_path):
    scalars = {
        "plasticity/q_net/dormant_fraction": [0.1, 0.2, 0.3],
        "plasticity/q_net/q_net.0/dormant_fraction": [0.0, 0.1, 0.2],
        "plasticity/monitor_seconds": [0.1, 0.2, 0.3],
    }
    write_run(tmp_path / "runs" / "DQN_1", dict(RETURNS, **scalars))
    names = {Path(p).name for p in plot_runs([str(tmp_path / "runs")], str(tmp_path / "out"))}
    assert "metric_plasticity__q_net__dormant_fraction.png" in names
    assert not any("q_net.0" in n for n in names)


def test_default_patterns_matching_nothing_warn(tmp_path):
    write_run(tmp_path / "runs" / "DQN_1", dict(RETURNS, **{"custom/thing": [1.0, 2.0, 3.0]}))
    written, messages = recorded(plot_runs, [str(tmp_path / "runs")], str(tmp_path / "out"))
    assert {Path(p).name for p in written} == {"return_curve.png"}
    assert any("default" in m and "metric" in m for m in messages)


def test_curves_are_cut_to_the_steps_every_run_covers(tmp_path):
    write_run(tmp_path / "runs" / "DQN_1", {"rollout/ep_rew_mean": [10.0, 20.0, 30.0]})
    write_run(tmp_path / "runs" / "DQN_2", {"rollout/ep_rew_mean": [20.0, 40.0]}, steps=(64, 128))
    runs = load_runs([str(tmp_path / "runs")])
    assert len({r.group for r in runs}) == 1
    (_, ax), messages = recorded(returns_figure, runs)
    line = ax.lines[0]
    assert line.get_xdata().tolist() == [64.0, 128.0]
    assert line.get_ydata().tolist() == pytest.approx([np.mean([10, 20]), np.mean([20, 40])])
    assert "2 seeds" in line.get_label()
    assert any("1 of 3" in m and "192" in m for m in messages)
    # plot_runs: one warning per group, not one per figure
    write_run(tmp_path / "more" / "DQN_1", {"rollout/ep_rew_mean": [1.0, 2.0, 3.0], "plasticity/q_net/grad_norm": [1, 2, 3]})
    write_run(
        tmp_path / "more" / "DQN_2", {"rollout/ep_rew_mean": [1.0, 2.0], "plasticity/q_net/grad_norm": [1, 2]}, steps=(64, 128)
    )
    _, messages = recorded(plot_runs, [str(tmp_path / "more")], str(tmp_path / "out"))
    assert sum("cut" in m for m in messages) == 1


def test_the_step_axis_and_switch_every_are_in_timesteps(tmp_path):
    """TensorBoard's step axis is SB3's ``num_timesteps`` (env steps summed over the vector env's copies), the unit
    of ``--switch-every`` (``change_every x n_envs``): the figures and the error say timesteps, not environment
    steps (of one copy, the unit of ``change_every``)."""
    run = write_run(tmp_path / "runs" / "DQN_1", dict(RETURNS, **{"plasticity/q_net/grad_norm": [1.0, 2.0, 3.0]}))
    runs = load_runs([str(run)])
    for fig_ax in (returns_figure(runs), metric_figure(runs, "plasticity/q_net/grad_norm")):
        label = fig_ax[1].get_xlabel()
        assert "num_timesteps" in label and "environment steps" not in label
    with pytest.raises(PlotError, match=r"timesteps per task \(change_every x n_envs\)"):
        plot_runs([str(run)], str(tmp_path / "out"), switch_every=0)
