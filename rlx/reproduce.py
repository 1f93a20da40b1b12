"""Reproduce one results table end to end: ``python -m rlx.reproduce NAME [--seeds N] [--quick]``.

Each experiment trains its presets (one ``python -m rlx.train`` process each, so every run
keeps its own directory, config, checkpoints and curves under ``experiments/NAME/runs/``),
measures its reference policies with the same evaluation code, and writes
``experiments/NAME/results.md`` plus a comparison plot. ``--quick`` shrinks every budget to
check the plumbing in a minute; its numbers mean nothing and its table says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from rlx.errors import InputError, UnknownNameError

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A table: trained presets, reference policies, and how to present them."""

    title: str
    presets: dict[str, str]  # row label -> +exp preset
    # (episodes, seeds) -> label -> {"return": per-seed returns, and the outcome's per-seed shares}
    baselines: Callable[[int, int], dict[str, dict[str, np.ndarray]]]
    claim: Callable[[dict[str, dict[str, float]]], list[str]]  # label -> means -> target lines
    quick_overrides: tuple[str, ...]
    score: Callable[[dict[str, dict[str, float]]], dict[str, str]] | None = None  # label -> means -> score text
    outcome: tuple[str, str] | None = None  # (episode outcome, column title): SMAX's ("won", "win rate")
    seeds: int = 5  # without --seeds; on a 2-core CPU's two devices 5 seeds run as 3 + 3 (padded)


# --------------------------------------------------------------------------- reference policies


def reference_results(env, params, policies: dict, episodes: int, seeds: int,
                      greedy: bool) -> dict[str, dict[str, np.ndarray]]:
    """label -> {"return": per-seed mean returns, and each of the env's episode outcomes as per-seed shares}.

    Each policy is measured by the runner's own evaluation code, on ``seeds`` fixed evaluation keys.
    """
    import jax

    from rlx.runner.evaluation import evaluate_episodes

    keys = jax.random.split(jax.random.PRNGKey(1234), seeds)
    results = {}
    for label, policy in policies.items():
        evaluate = jax.jit(lambda key, policy=policy: evaluate_episodes(
            policy, env, params, None, key, episodes, greedy))
        per_seed = [jax.device_get(evaluate(k)) for k in keys]
        results[label] = {"return": np.array([float(r.mean()) for r, _ in per_seed]),
                          **{name: np.array([float(o[name].mean()) for _, o in per_seed]) for name in per_seed[0][1]}}
    return results


# --------------------------------------------------------------------------- mappo_mpe


def mpe_spread_baselines(episodes: int, seeds: int) -> dict[str, dict[str, np.ndarray]]:
    """Per-seed mean team returns of a random and the scripted assignment policy on mpe_spread."""
    from rlx.baselines.multi_agent import random_policy, spread_scripted_policy
    from rlx.envs import registry

    env, params = registry.make("mpe_spread")
    num_landmarks = (env.observation_space(params).shape[0] - 4 - 4 * (env.num_agents - 1)) // 2
    policies = {
        "random policy": random_policy(int(env.action_space(params).n)),
        "scripted (optimal assignment, steer to landmark)": spread_scripted_policy(env.num_agents, num_landmarks),
    }
    return reference_results(env, params, policies, episodes, seeds, greedy=True)


def spread_scores(means: dict[str, dict[str, float]]) -> dict[str, str]:
    """Each return as a fraction of the way from the random policy to the scripted reference."""
    random_return = means["random policy"]["return"]
    scripted = means["scripted (optimal assignment, steer to landmark)"]["return"]
    return {label: f"{(m['return'] - random_return) / (scripted - random_return):.2f}" for label, m in means.items()}


def spread_claim(means: dict[str, dict[str, float]]) -> list[str]:
    score = {k: float(v) for k, v in spread_scores(means).items()}
    mappo, ippo = means["MAPPO"]["return"], means["IPPO"]["return"]
    return [
        f"- MAPPO reaches >= 0.90 of the scripted reference (from random): "
        f"{'HOLDS' if score['MAPPO'] >= 0.9 else 'DOES NOT HOLD'} ({score['MAPPO']:.2f})",
        f"- MAPPO beats IPPO at equal env steps: {'HOLDS' if mappo > ippo else 'DOES NOT HOLD'} "
        f"(MAPPO {mappo:.2f}, IPPO {ippo:.2f})",
    ]


# --------------------------------------------------------------------------- smax_3m

SMAX_HEURISTIC = "JaxMARL's heuristic team (the enemy's own script)"


def smax_baselines(episodes: int, seeds: int) -> dict[str, dict[str, np.ndarray]]:
    """Per-seed team returns and win rates of a random and the heuristic team on smax_3m (sampled actions)."""
    from rlx.baselines.multi_agent import random_policy, smax_heuristic_policy
    from rlx.envs import registry

    env, params = registry.make("smax_3m")
    policies = {"random policy": random_policy(int(env.action_space(params).n)),
                SMAX_HEURISTIC: smax_heuristic_policy(env)}
    return reference_results(env, params, policies, episodes, seeds, greedy=False)


def smax_claim(means: dict[str, dict[str, float]]) -> list[str]:
    mappo, heuristic = means["MAPPO"]["won"], means[SMAX_HEURISTIC]["won"]
    return [f"- MAPPO wins at least as often as the heuristic team against its mirror image: "
            f"{'HOLDS' if mappo >= heuristic else 'DOES NOT HOLD'} (MAPPO {mappo:.0%}, heuristic {heuristic:.0%})"]


EXPERIMENTS = {
    "mappo_mpe": Experiment(
        title="MPE simple_spread (3 agents, 3 landmarks, 25-step episodes): MAPPO vs IPPO vs critic-free",
        presets={"MAPPO": "mappo_mpe_spread", "IPPO": "ippo_mpe_spread", "critic-free (group baseline)": "mappo_grpo_mpe_spread"},
        baselines=mpe_spread_baselines,
        score=spread_scores,
        claim=spread_claim,
        quick_overrides=("algo.total_timesteps=8192", "algo.num_envs=16", "algo.num_steps=32", "run.eval_episodes=8"),
    ),
    "smax_3m": Experiment(
        title="SMAX 3m (3 marines against JaxMARL's heuristic marines): MAPPO's win rate on a CPU budget",
        presets={"MAPPO": "mappo_smax_3m_cpu"},
        baselines=smax_baselines,
        claim=smax_claim,
        quick_overrides=("algo.total_timesteps=8192", "algo.num_envs=16", "algo.num_steps=32", "run.eval_episodes=8"),
        outcome=("won", "win rate"),
        seeds=4,
    ),
}


# --------------------------------------------------------------------------- driver


def set_aside_earlier_run(run_dir: Path) -> None:
    """Move a run a study trained into ``run_dir`` before to ``<run_dir>.previous`` (replacing an older one
    there): ``rlx.train`` refuses a directory that holds a run, and a study's rerun keeps the last one."""
    run_dir = Path(run_dir)
    if run_dir.exists():
        previous = run_dir.with_name(run_dir.name + ".previous")
        shutil.rmtree(previous, ignore_errors=True)
        run_dir.rename(previous)
        print(f"[reproduce] the earlier run in {run_dir} moved to {previous}", flush=True)


def train_preset(preset: str, run_dir: Path, seeds: int, overrides: tuple[str, ...]) -> dict:
    """Run ``python -m rlx.train +exp=preset`` into ``run_dir`` (an earlier run there set aside) and return
    its summary.json."""
    set_aside_earlier_run(run_dir)
    command = [sys.executable, "-m", "rlx.train", f"+exp={preset}", f"run.num_seeds={seeds}",
               f"hydra.run.dir={run_dir}", *overrides]
    print(f"[reproduce] {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return json.loads((run_dir / "summary.json").read_text())


def render(name: str, experiment: Experiment, rows: dict[str, dict], command: str, quick: bool) -> str:
    """The results table: one row per method (label -> per-seed arrays under "return" and the outcome)."""
    means = {label: {key: float(np.mean(v)) for key, v in row["per_seed"].items()} for label, row in rows.items()}
    scores = experiment.score(means) if experiment.score else None
    outcome, outcome_title = experiment.outcome or (None, None)
    lines = [f"# {experiment.title}", ""]
    if quick:
        lines += ["QUICK smoke test (tiny budgets): these numbers mean nothing.", ""]
    titles = ["method", "env steps per seed", "seeds", "final return (mean ± std over seeds)"]
    titles += [f"{outcome_title} (mean ± std over seeds)"] * bool(outcome) + ["score"] * bool(scores)
    lines += [f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `{command}`.", "",
              "| " + " | ".join(titles) + " |", "|---|" + "---:|" * (len(titles) - 1)]
    for label, row in rows.items():
        steps = f"{row['env_steps']:,}" if row.get("env_steps") else "—"
        returns = row["per_seed"]["return"]
        cells = [label, steps, str(len(returns)), f"{returns.mean():.2f} ± {returns.std():.2f}"]
        if outcome:
            shares = row["per_seed"][outcome]
            cells.append(f"{shares.mean():.0%} ± {shares.std():.0%}")
        lines.append("| " + " | ".join(cells + ([scores[label]] if scores else [])) + " |")
    lines += ["", "Targets:", "", *experiment.claim(means), ""]
    return "\n".join(lines)


# Tables of another shape, each with its own driver module: name -> module with reproduce(out, quick, skip_training).
# name -> module with reproduce(out_dir, quick, skip_training); it writes into experiments/<its
# EXPERIMENT_DIR, or the name>/
CUSTOM = {"mapf_random": "rlx.envs.mapf.study", "mm_quoting": "rlx.envs.market.quoting_study",
          "mm_event_vs_time": "rlx.envs.market.event_study", "pbrl_feedback": "rlx.pbrl.feedback_study",
          "pbrl_queries": "rlx.pbrl.query_study", "pbrl_offline": "rlx.pbrl.offline_study",
          "imagination_efficiency": "rlx.imagination.sample_efficiency",
          "imagination_generalization": "rlx.imagination.generalization",
          "imagination_model_error": "rlx.imagination.model_error"}


def check_tasks(tasks: tuple | None, valid) -> None:
    """Stop before any work when ``tasks`` names one a study does not run, listing the ``valid`` ones."""
    for task in tasks or ():
        if task not in valid:
            raise SystemExit(f"task {task!r}: valid: {', '.join(valid)}")


def reproduce(name: str, seeds: int | None, quick: bool, skip_training: bool = False,
              tasks: tuple[str, ...] | None = None) -> Path:
    """Train, evaluate and write one experiment's table; ``seeds`` None: the experiment's own count.

    ``tasks``: rerun only these tasks of a study that runs several (pbrl_feedback, pbrl_queries; the level
    counts of imagination_generalization), keeping the others' saved rows.
    """
    if name in CUSTOM:
        import importlib
        import inspect

        study = importlib.import_module(CUSTOM[name])
        extra, accepted = {}, inspect.signature(study.reproduce).parameters
        if tasks:
            if "tasks" not in accepted:
                raise SystemExit(f"--tasks: {name} has no tasks to choose from; it runs as a whole")
            extra["tasks"] = tasks
        if seeds is not None:
            if "seeds" not in accepted:
                raise SystemExit(f"--seeds: {name} runs its own fixed number of seeds")
            extra["seeds"] = seeds
        return study.reproduce(ROOT / "experiments" / getattr(study, "EXPERIMENT_DIR", name), quick, skip_training,
                               **extra)
    if name not in EXPERIMENTS:
        raise UnknownNameError("experiment", name, sorted({**EXPERIMENTS, **CUSTOM}))
    if tasks:
        raise SystemExit(f"--tasks: {name} has no tasks to choose from; it runs as a whole")
    if skip_training:
        raise SystemExit(f"--skip-training: {name} keeps no runs to evaluate again; it trains its presets each time")
    experiment = EXPERIMENTS[name]
    seeds = experiment.seeds if seeds is None else seeds
    out = ROOT / "experiments" / name
    overrides = experiment.quick_overrides if quick else ()
    rows, run_dirs = {}, []
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    for label, preset in experiment.presets.items():
        run_dirs.append(out / "runs" / f"{preset}{'_quick' if quick else ''}" / stamp)
        summary = train_preset(preset, run_dirs[-1], seeds, overrides)
        final = summary["final_eval"]
        per_seed = {"return": np.array(final["return_per_seed"])}
        if experiment.outcome:
            per_seed[experiment.outcome[0]] = np.array(final[f"{experiment.outcome[0]}_per_seed"])
        rows[label] = {"per_seed": per_seed, "env_steps": summary["env_steps_per_seed"],
                       "episodes": final["episodes_per_seed"]}
    episodes = next(iter(rows.values()))["episodes"]
    for label, per_seed in experiment.baselines(episodes, seeds).items():
        rows[label] = {"per_seed": per_seed, "env_steps": None}
    command = f"python -m rlx.reproduce {name} --seeds {seeds}" + (" --quick" if quick else "")
    results = out / ("results_quick.md" if quick else "results.md")
    results.write_text(render(name, experiment, rows, command, quick))
    subprocess.run([sys.executable, "-m", "rlx.report", *map(str, run_dirs), "--out",
                    str(out / ("report_quick" if quick else "report"))], check=True, cwd=ROOT)
    print(results.read_text())
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rlx.reproduce", description=__doc__.splitlines()[0])
    parser.add_argument("name", help=f"one of {sorted({**EXPERIMENTS, **CUSTOM})}")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per preset (default: the experiment's, 5 or 4)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: check the plumbing, numbers meaningless")
    parser.add_argument("--skip-training", action="store_true",
                        help="mapf_random, mm_quoting: evaluate the runs already in experiments/NAME/runs instead of "
                        "training; imagination_*, pbrl_queries: re-render the table from its saved json; the others, which "
                        "keep no runs to reuse, refuse it")
    parser.add_argument("--tasks", default=None,
                        help="pbrl_feedback, pbrl_queries: comma-separated tasks to rerun (e.g. Pendulum-v1); "
                        "imagination_generalization: level counts (e.g. 16,64); mapf_random: row groups (baselines, "
                        "map_policy, dagger, mappo); the others' saved rows stay")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        parser.error(f"--seeds {args.seeds}: must be >= 1")
    from rlx.runner import compile_cache

    compile_cache.prepare_command()
    try:
        reproduce(args.name, args.seeds, args.quick, args.skip_training,
                  tuple(args.tasks.split(",")) if args.tasks else None)
    except InputError as error:  # bad names, settings or data files: one line, no traceback
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
