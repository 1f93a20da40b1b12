"""Query strategies at small label budgets: ``python -m rlx.reproduce pbrl_queries [--quick]`` (16 seeds).

The feedback study's 5 seeds per row cannot tell the strategies apart at 25 and 50 labels: there a
row's 95% interval is often 100+ return wide on CartPole and 400+ on Pendulum, because each seed
either solves the task or does not. This study reruns just those rows (uniform, disagreement and
query-policy-aligned queries, same task settings as ``feedback_study``) with 16 seeds (64 on
Pendulum, whose per-seed returns spread from -150 to -1600 at these budgets), and compares
query-aligned selection with each other strategy seed by seed (the same seed keys train every
strategy). "At least as good" is judged twice: on the means, and as "not significantly worse" (the
95% interval of the mean per-seed difference reaches zero or above). Writes
``experiments/pbrl/queries.md`` and ``queries.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from rlx.pbrl import feedback_study
from rlx.report import t_interval
from rlx.reproduce import check_tasks

EXPERIMENT_DIR = feedback_study.EXPERIMENT_DIR
BUDGETS = (25, 50)
SEEDS = 16
TASK_SEEDS = {"Pendulum-v1": 64}  # tasks that need more than SEEDS to tell the strategies apart
ALIGNED = "query-aligned"


def study_task(task: str, settings: dict, seeds: int, log) -> dict:
    """Random, PPO on the true reward, and each strategy at each small budget: per-seed returns."""
    from rlx.envs import registry

    env, params = registry.make(task)
    rows = feedback_study.reference_returns(env, params, settings, seeds)
    for budget in BUDGETS:
        for strategy in feedback_study.STRATEGIES:
            started = time.time()
            rows[f"{strategy}, {budget} labels"] = returns = feedback_study.strategy_returns(
                env, params, settings, strategy, budget, seeds)
            log(f"{task}: {strategy} {budget}: {returns.mean():.1f} ({time.time() - started:.0f} s)")
    return {label: returns.tolist() for label, returns in rows.items()}


def comparisons(rows: dict) -> list[dict]:
    """Query-aligned against each other strategy at each budget: mean difference and its 95% interval."""
    found = []
    for budget in BUDGETS:
        aligned = np.asarray(rows[f"{ALIGNED}, {budget} labels"])
        for strategy in feedback_study.STRATEGIES:
            if strategy == ALIGNED:
                continue
            other = np.asarray(rows[f"{strategy}, {budget} labels"])
            difference = aligned - other
            half = t_interval(difference)
            found.append({"budget": budget, "against": strategy, "difference": float(difference.mean()),
                          "ci95": half, "mean_holds": bool(aligned.mean() >= other.mean()),
                          "not_worse": bool(difference.mean() + half >= 0)})
    return found


def seeds_by_task(saved: dict) -> dict:
    """``{task: seeds}`` of a saved study (older files keep one count for every task)."""
    seeds = saved["seeds"]
    return seeds if isinstance(seeds, dict) else {task: seeds for task in saved["tasks"]}


def markdown(saved: dict) -> str:
    results, seconds, seeds = saved["tasks"], sum(saved["seconds"].values()), seeds_by_task(saved)
    lines = [f"Measured by `python -m rlx.reproduce pbrl_queries` ({seconds / 60:.0f} min of training on this "
             "machine; each task's date in its heading): greedy evaluation return "
             f"({feedback_study.EVAL_EPISODES} episodes per seed), oracle teacher, the feedback "
             "study's settings per task. Differences are query-aligned minus the other strategy, seed by seed "
             "(mean ± 95% interval).", ""]
    for task, rows in results.items():
        low, high = np.mean(rows["random"]), np.mean(rows["PPO, true reward"])
        measured = saved.get("measured", {}).get(task)
        lines += [f"### {task} ({seeds[task]} seeds{f', {measured}' if measured else ''})", "",
                  "| agent | return (mean ± 95% CI) | normalized | per seed: min, median, max |", "|---|---:|---:|---|"]
        for label, returns in rows.items():
            returns = np.asarray(returns)
            lines.append(f"| {label} | {returns.mean():.1f} ± {t_interval(returns):.1f} | "
                         f"{(returns.mean() - low) / (high - low):.2f} | {returns.min():.0f}, "
                         f"{np.median(returns):.0f}, {returns.max():.0f} |")
        lines += ["", "| budget | query-aligned minus | difference | on the means | not significantly worse |",
                  "|---:|---|---:|---|---|"]
        for c in comparisons(rows):
            lines.append(f"| {c['budget']} | {c['against']} | {c['difference']:+.1f} ± {c['ci95']:.1f} | "
                         f"{'holds' if c['mean_holds'] else 'does not hold'} | "
                         f"{'holds' if c['not_worse'] else 'does not hold'} |")
        lines.append("")
    return "\n".join(lines)


def reproduce(out: Path, quick: bool, skip_training: bool, seeds: int | None = None,
              tasks: tuple | None = None) -> Path:
    """Run the study task by task (the files are rewritten after each) and return ``queries.md``.

    ``seeds``: one count for every task (default: ``SEEDS``, or the task's ``TASK_SEEDS``);
    ``tasks``: rerun only these, keeping the other tasks' saved rows.
    """
    out.mkdir(parents=True, exist_ok=True)
    configs = feedback_study.task_configs(quick)
    check_tasks(tasks, configs)
    suffix = "_quick" if quick else ""
    path, saved = out / f"queries{suffix}.md", out / f"queries{suffix}.json"
    if skip_training and not saved.is_file():
        raise SystemExit(f"{saved}: nothing to re-render; run without --skip-training first")
    keep = (tasks or skip_training) and saved.is_file()
    results = json.loads(saved.read_text()) if keep else {"seeds": {}, "tasks": {}, "seconds": {}}
    results["seeds"] = seeds_by_task(results)
    for task in ([] if skip_training else tasks or configs):
        count = 2 if quick else seeds or TASK_SEEDS.get(task, SEEDS)
        started = time.time()
        results["tasks"][task] = study_task(task, configs[task], count, print)
        results["seeds"][task] = count
        results.setdefault("measured", {})[task] = time.strftime("%Y-%m-%d")
        results["seconds"][task] = time.time() - started
        saved.write_text(json.dumps(results, indent=1))
        path.write_text(markdown(results))
    path.write_text(markdown(results))
    print(path.read_text())
    return path
