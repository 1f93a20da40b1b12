"""Feedback efficiency of preference PPO: ``python -m rlx.reproduce pbrl_feedback [--quick] [--seeds 5]``.

For each task (CartPole, Acrobot, Pendulum), trains ``rlx/agents/pref_ppo.py`` from a scripted
oracle with label budgets {25, 50, 100, 200, 400} and three query strategies (uniform, ensemble
disagreement, and query-policy-aligned uniform: QPA), then each B-Pref teacher (stochastic,
mistake, skip, equal, myopic) at 100 labels with uniform queries, plus plain PPO with the same
settings on the true reward and a uniformly random policy, with the same seeds (vmapped in one
program per setting). Reports the greedy evaluation return (16 episodes per seed) and the score
normalised between random (0) and PPO on the true reward (1): mean, 95% interval over seeds, per-seed values. Writes
``experiments/pbrl/feedback.md`` and ``feedback.json``; the numbers are whatever the runs give.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np

from rlx.report import t_interval
from rlx.reproduce import check_tasks

BUDGETS = (25, 50, 100, 200, 400)
STRATEGIES = {"uniform": dict(selection="uniform"), "disagreement": dict(selection="disagreement"),
              "query-aligned": dict(selection="uniform", query_policy_aligned=True)}
EVAL_EPISODES = 16
# Teacher robustness: each B-Pref teacher at one budget, uniform queries. Thresholds are per task, in
# units of its 16-step segment returns (CartPole: the steps before a fall, 16 without one; Acrobot:
# minus the steps before the goal, -16 without it; Pendulum: about -250 to 0).
TEACHER_BUDGET = 100
TEACHERS = {
    "CartPole-v1": {"stochastic": dict(teacher_beta=1.0), "mistake": dict(teacher_epsilon=0.1),
                    "skip": dict(teacher_skip_threshold=15.5),  # both segments fall: skipped
                    "equal": dict(teacher_equal_threshold=1.5),  # falls at most one step apart: a tie
                    "myopic": dict(teacher_gamma=0.9)},
    "Acrobot-v1": {"stochastic": dict(teacher_beta=1.0), "mistake": dict(teacher_epsilon=0.1),
                   "skip": dict(teacher_skip_threshold=-15.5),  # neither segment reaches the goal: skipped
                   "equal": dict(teacher_equal_threshold=1.5),  # goals at most one step apart: a tie
                   "myopic": dict(teacher_gamma=0.9)},
    "Pendulum-v1": {"stochastic": dict(teacher_beta=0.1), "mistake": dict(teacher_epsilon=0.1),
                    "skip": dict(teacher_skip_threshold=-150.0), "equal": dict(teacher_equal_threshold=10.0),
                    "myopic": dict(teacher_gamma=0.9)},
}
EXPERIMENT_DIR = "pbrl"
# PPO settings shared by the preference agent and its true-reward reference
PPO_FIELDS = ("total_timesteps", "num_envs", "num_steps", "num_epochs", "num_minibatches", "lr", "ent_coef",
              "gamma", "gae_lambda", "normalize_observations", "normalize_rewards", "hidden_sizes")
# Acrobot: the ppo_acrobot preset's PPO at half its budget; reaching the goal ends the episode, so the
# absorbing state (0 per step against -1) is what the labels must teach.
ACROBOT = dict(total_timesteps=245760, num_envs=16, num_steps=128, num_epochs=4, num_minibatches=4, lr=1e-3,
               ent_coef=0.0, gamma=0.99, gae_lambda=0.94, normalize_observations=True, normalize_rewards=False,
               segment_length=16, pool_segments=512, num_candidates=256, queries_per_feedback=10,
               feedback_every=0, reward_steps=50, reward_batch_size=32, eval_pairs=64)
PENDULUM = dict(total_timesteps=327680, num_envs=16, num_steps=128, num_epochs=10, num_minibatches=16, lr=1e-3,
                ent_coef=0.0, gamma=0.95, gae_lambda=0.95, normalize_observations=True, normalize_rewards=True,
                segment_length=16, pool_segments=512, num_candidates=256, queries_per_feedback=10,
                feedback_every=2, reward_steps=50, reward_batch_size=32, eval_pairs=64)


def task_configs(quick: bool) -> dict:
    """Task -> pref_ppo settings (a budget and strategy are added per row); PPO takes the shared fields."""
    from rlx.agents import pref_ppo

    cartpole = pref_ppo.cartpole_config()
    cartpole = {name: getattr(cartpole, name) for name in cartpole.__dataclass_fields__}
    tasks = {"CartPole-v1": cartpole, "Acrobot-v1": dict(ACROBOT), "Pendulum-v1": dict(PENDULUM)}
    if quick:
        for settings in tasks.values():
            settings["total_timesteps"] = 4 * settings["num_envs"] * settings["num_steps"]
    return tasks


def trained_returns(module, config, env, params, seeds: int) -> np.ndarray:
    """Greedy evaluation return per seed after training ``seeds`` runs vmapped in one program."""
    from rlx.runner.evaluation import evaluate

    agent = module.make(config, env, params)

    def run(key):
        train_key, eval_key = jax.random.split(key)
        state, _ = module.train(config, env, params, train_key)
        return evaluate(agent, env, params, state.policy, eval_key, EVAL_EPISODES, True).mean()

    return np.asarray(jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(0), seeds)), np.float64)


def random_returns(env, params, seeds: int) -> np.ndarray:
    """Evaluation return per seed of uniformly random actions."""
    from rlx.baselines.single_agent import uniform_policy
    from rlx.runner.evaluation import evaluate

    uniform = uniform_policy(env, params)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    run = jax.vmap(lambda key: evaluate(uniform, env, params, None, key, EVAL_EPISODES, False).mean())
    return np.asarray(jax.jit(run)(keys), np.float64)


def reference_returns(env, params, settings: dict, seeds: int) -> dict:
    """The two rows every table normalises by: uniformly random actions and PPO on the true reward."""
    from rlx.agents import ppo

    ppo_config = ppo.Config(**{name: settings[name] for name in PPO_FIELDS if name in settings})
    return {"random": random_returns(env, params, seeds),
            "PPO, true reward": trained_returns(ppo, ppo_config, env, params, seeds)}


def strategy_returns(env, params, settings: dict, strategy: str, budget: int, seeds: int) -> np.ndarray:
    """Per-seed returns of preference PPO with one query strategy and label budget."""
    from rlx.agents import pref_ppo

    config = pref_ppo.Config(**{**settings, **STRATEGIES[strategy], "budget": budget})
    pref_ppo.validate(config)
    return trained_returns(pref_ppo, config, env, params, seeds)


def summarise(returns: np.ndarray, low: float, high: float) -> dict:
    """One table row: per-seed returns, mean, 95% interval, and the mean normalised between low and high."""
    return {"returns": returns.tolist(), "mean": float(returns.mean()), "ci95": t_interval(returns),
            "normalized": float((returns.mean() - low) / (high - low))}


def study_task(task: str, settings: dict, seeds: int, log) -> dict:
    """Every row of one task: random, PPO on the true reward, and each strategy x budget."""
    from rlx.agents import pref_ppo
    from rlx.envs import registry

    env, params = registry.make(task)
    rows = reference_returns(env, params, settings, seeds)
    log(f"{task}: random {rows['random'].mean():.1f}, PPO {rows['PPO, true reward'].mean():.1f}")
    for strategy in STRATEGIES:
        for budget in BUDGETS:
            started = time.time()
            rows[f"{strategy}, {budget} labels"] = returns = strategy_returns(env, params, settings, strategy, budget,
                                                                              seeds)
            log(f"{task}: {strategy} {budget}: {returns.mean():.1f} ({time.time() - started:.0f} s)")
    for teacher, numbers in TEACHERS.get(task, {}).items():
        config = pref_ppo.Config(**{**settings, "selection": "uniform", **numbers, "teacher": teacher,
                                    "budget": TEACHER_BUDGET})
        rows[f"{teacher} teacher, uniform, {TEACHER_BUDGET} labels"] = returns = trained_returns(
            pref_ppo, config, env, params, seeds)
        log(f"{task}: {teacher} teacher: {returns.mean():.1f}")
    low, high = rows["random"].mean(), rows["PPO, true reward"].mean()
    return {label: summarise(returns, low, high) for label, returns in rows.items()}


MEASURED = "_measured"  # feedback.json's key for each task's measurement date (not a task)


def markdown(results: dict, seconds: float) -> str:
    """The tables of ``results``; each task's heading gives its seed count (read off its rows) and the date it
    was measured (``results[MEASURED]``, kept since 2026-12-08), so rows that a ``--tasks`` run keeps from an
    earlier one are not described by the later run's settings."""
    measured = results.get(MEASURED, {})
    lines = [f"Greedy evaluation return ({EVAL_EPISODES} episodes per seed), oracle teacher; normalized = (return - "
             "random) / (PPO on the true reward - random); mean ± 95% Student-t interval over seeds. Each task's "
             f"seed count and measurement date (where recorded) in its heading. The last run took {seconds / 60:.0f} "
             "min on this machine.", ""]
    for task, rows in results.items():
        if task == MEASURED:
            continue
        counts = sorted({len(row["returns"]) for row in rows.values()})
        heading = f"{'/'.join(map(str, counts))} seeds" + (f", {measured[task]}" if task in measured else "")
        lines += [f"### {task} ({heading})", "", "| agent | return (mean ± 95% CI) | normalized | per seed |",
                  "|---|---:|---:|---|"]
        for label, row in rows.items():
            lines.append(f"| {label} | {row['mean']:.1f} ± {row['ci95']:.1f} | {row['normalized']:.2f} | "
                         f"{', '.join(f'{r:.0f}' for r in row['returns'])} |")
        lines.append("")
    return "\n".join(lines)


def rerun_strategies(saved: dict, task: str, settings: dict, strategies: tuple, seeds: int, log) -> dict:
    """``saved``'s rows of one task with just the named strategies' rows trained again (e.g. after a change
    that touches only them); random and PPO stay as saved, so every row keeps the same normalisation."""
    from rlx.envs import registry

    unknown = set(strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}; valid: {list(STRATEGIES)}")
    env, params = registry.make(task)
    rows = dict(saved)
    low, high = rows["random"]["mean"], rows["PPO, true reward"]["mean"]
    for strategy in strategies:
        for budget in BUDGETS:
            returns = strategy_returns(env, params, settings, strategy, budget, seeds)
            rows[f"{strategy}, {budget} labels"] = summarise(returns, low, high)
            log(f"{task}: {strategy} {budget}: {returns.mean():.1f} (rerun)")
    return rows


def reproduce(out: Path, quick: bool, skip_training: bool, seeds: int = 5, tasks: tuple | None = None,
              strategies: tuple | None = None) -> Path:
    """Run the study and write ``feedback.md`` / ``feedback.json`` into ``out`` (``_quick`` files for ``quick``).

    ``tasks`` reruns only those tasks; ``strategies`` only those strategies' rows of the saved tables."""
    if skip_training:
        raise SystemExit("--skip-training: pbrl_feedback keeps no trained runs to evaluate again; it trains each "
                         "time (use --tasks or strategies= to rerun part of it)")
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    configs = task_configs(quick)
    check_tasks(tasks, configs)
    suffix = "_quick" if quick else ""
    path, saved = out / f"feedback{suffix}.md", out / f"feedback{suffix}.json"
    keep = (tasks or strategies) and saved.is_file()
    results = json.loads(saved.read_text()) if keep else {}  # rerun some tasks or rows, keep the rest
    for task in tasks or configs:  # the files are rewritten after each task: a long study keeps what it has
        if strategies:
            results[task] = rerun_strategies(results[task], task, configs[task], strategies, 2 if quick else seeds, print)
        else:
            results[task] = study_task(task, configs[task], 2 if quick else seeds, print)
        results[MEASURED] = {**results.get(MEASURED, {}), task: time.strftime("%Y-%m-%d", time.gmtime())}
        saved.write_text(json.dumps(results, indent=1))
        path.write_text(markdown(results, time.time() - started))
    print(path.read_text())
    return path
