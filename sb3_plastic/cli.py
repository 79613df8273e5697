"""The ``sb3-plastic`` command.

Subcommands (argparse sub-parsers; each is a ``_add_<name>(subparsers)`` builder and a ``_run_<name>(args)``
function, so more, e.g. ``train`` and ``enjoy``, can be added alongside):

* ``train`` / ``enjoy``: rl_zoo3's own train / enjoy with the eight plastic algorithms (plastic_ppo, plastic_dqn,
  plastic_sac, plastic_qrdqn, plastic_tqc, plastic_crossq, plastic_ppo_lstm, plastic_ppo_mask), their optuna
  samplers and the ``sb3_plastic/`` environments registered (:mod:`sb3_plastic.zoo`).
* ``plot``: figures of one or many runs from their TensorBoard event files, one set per environment
  (:mod:`sb3_plastic.plot`).

Examples::

    sb3-plastic plot runs/ --out plots/ --switch-every 100000       # one curve per algorithm + differing hyperparameters
    sb3-plastic plot logs/ppo_relu logs/ppo_maxmin --metrics "plasticity/*/ntk_cond" "plasticity/policy/**/srank"
    python -m sb3_plastic plot logs/ --group-by "(ppo_[a-z]+)_seed" --out plots/
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Optional

#: rl_zoo3's commands, run with the plastic algorithms, samplers and environments registered (every
#: rl_zoo3 option works: ``sb3-plastic train -h`` prints rl_zoo3's own help)
ZOO_COMMANDS = {
    "train": "train (or tune with -optimize) from zoo_configs/ yaml through rl_zoo3",
    "enjoy": "run a trained agent through rl_zoo3's enjoy",
}


def positive_int(text: str) -> int:
    """argparse type: a positive integer (``ArgumentTypeError`` naming the text otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _add_plot(subparsers: argparse._SubParsersAction) -> None:
    from sb3_plastic.plot import DEFAULT_METRICS, RETURN_TAG

    parser = subparsers.add_parser(
        "plot",
        help="plot runs from their TensorBoard event files",
        description=(
            "Read the TensorBoard event files of one or many runs, group the runs by method and write PNG "
            "figures (mean ± std over seeds): episode return vs environment steps with the task switches "
            "marked, mean return per task, and chosen plasticity diagnostics."
        ),
    )
    parser.add_argument(
        "runs",
        nargs="+",
        help="run directories, directories above them (searched recursively for events.out.tfevents.*), or event files",
    )
    parser.add_argument("--out", default="plots", help="directory for the PNG files (default: %(default)s)")
    parser.add_argument(
        "--group-by",
        default=None,
        metavar="REGEX",
        help="regular expression searched in each run's path; its first group (or whole match) names the "
        "method (an expression that matches no run is an error). Default: the algorithm plus the "
        "hyperparameters that differ between the runs, from the run metadata sb3-plastic writes next to the "
        "event files (sb3_plastic_run.json); runs without it: <parent dir>/<run dir> without SB3's _<n> suffix",
    )
    parser.add_argument(
        "--switch-every",
        type=positive_int,
        default=None,
        metavar="STEPS",
        help="model timesteps per task (= change_every x n_envs), the unit of the TensorBoard step axis, to mark "
        "task switches (default: from the logged plasticity/task_id)",
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        metavar="TAG",
        help="diagnostic tags or glob patterns ('*' within one '/' level, '**' across levels); a pattern that "
        f"matches no tag is an error. Default: those of {' '.join(DEFAULT_METRICS)} the runs log",
    )
    parser.add_argument(
        "--return-tag",
        default=None,
        help=f"scalar tag of the episode return; a tag no run logs is an error (default: {RETURN_TAG})",
    )
    parser.add_argument(
        "--together",
        action="store_true",
        help="draw the runs of every environment on the same axes (default: when the runs cover several "
        "environments, one set of figures per environment, in OUT/<env id>/)",
    )
    parser.set_defaults(func=_run_plot)


def _run_plot(args: argparse.Namespace) -> int:
    import warnings

    from sb3_plastic.plot import PlotError, plot_runs

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            written = plot_runs(
                args.runs,
                args.out,
                metrics=args.metrics,
                switch_every=args.switch_every,
                group_by=args.group_by,
                return_tag=args.return_tag,
                split_envs=not args.together,
            )
    except (FileNotFoundError, PlotError) as error:
        print(f"sb3-plastic plot: error: {error}", file=sys.stderr)
        return 1
    for warning in caught:
        print(f"sb3-plastic plot: warning: {warning.message}", file=sys.stderr)
    if not written:
        print("sb3-plastic plot: nothing to plot (no return tag and no matching diagnostics)", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``sb3-plastic`` with all its subcommands."""
    parser = argparse.ArgumentParser(
        prog="sb3-plastic",
        description="sb3-plastic: Stable-Baselines3 agents that keep their ability to learn when the world changes.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, text in ZOO_COMMANDS.items():
        # listed for --help only: main() hands these over to rl_zoo3's own parser before argparse runs
        subparsers.add_parser(name, help=text, add_help=False)
    _add_plot(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``sb3-plastic`` (and ``python -m sb3_plastic``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ZOO_COMMANDS:
        from sb3_plastic import zoo

        getattr(zoo, argv[0])(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
