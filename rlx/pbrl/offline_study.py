"""Offline preference learning on rlx-made datasets: CPL against behaviour cloning.

``run_study(out_dir)`` makes (or reuses) the datasets of ``rlx.pbrl.datasets`` -- PPO policies
at the ``random``, ``medium``, ``expert`` and ``replay`` levels on CartPole-v1, Acrobot-v1 and
Pendulum-v1, with pairs of segments labelled by an oracle on summed true reward -- and trains
three learners from each (``rlx/agents/cpl.py``, the seeds of one learner vmapped in one
program):

* ``CPL`` -- Contrastive Preference Learning (conservative bias, a small BC regulariser);
* ``BC (all)`` -- behaviour cloning of every action of the dataset (labels unused);
* ``BC (preferred)`` -- behaviour cloning of the preferred segment of each pair (both for ties).

Each trained policy plays ``eval_episodes`` fresh episodes greedily; its score is the mean true
return. ``offline.md`` has one row per (environment, dataset, learner): the mean over seeds with
a 95% Student-t interval and the per-seed values, next to the return of the policies that made
the data (sampled actions). ``offline.json`` holds the same numbers plus dataset summaries.
Quick mode (``quick=True``: small datasets, short training, few episodes) writes
``offline_quick.*`` and only checks the plumbing. ``python -m rlx.reproduce pbrl_offline`` runs
it into ``experiments/pbrl/``.

Per-environment learner settings (``LEARNER``) were chosen from a handful of runs on the seed-0
datasets (not held out): CartPole and Acrobot use ``cpl.Config``'s defaults; on Pendulum every
learner uses the fixed-variance ("deterministic") continuous policy with ``alpha = 1``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

EXPERIMENT_DIR = "pbrl"  # python -m rlx.reproduce pbrl_offline writes experiments/pbrl/offline.md

import numpy as np

from rlx.pbrl import datasets
from rlx.report import t_interval

METHODS = {"CPL": "cpl", "BC (all)": "bc_all", "BC (preferred)": "bc_preferred"}
ENVS = ("cartpole", "acrobot", "pendulum")
LEARNER = {
    "cartpole": {},
    "acrobot": {},
    "pendulum": dict(policy="deterministic", alpha=1.0, conservative_bias=0.5, bc_weight=0.2),
}
FULL = dict(num_updates=2000, eval_episodes=16)
QUICK = dict(num_updates=200, eval_episodes=4)


def run_study(out_dir, envs=ENVS, levels=datasets.LEVELS, seeds: int = 5, quick: bool = False,
              cache_dir=None, num_updates: int | None = None, eval_episodes: int | None = None,
              methods=tuple(METHODS), dataset_settings: dict | None = None) -> dict:
    """Train every learner on every dataset, write ``offline[_quick].md`` and ``.json`` to ``out_dir``.

    Returns ``{"info", "rows", "datasets"}`` as in ``offline.json``. ``cache_dir`` (default
    ``out_dir/runs/datasets``) keeps the datasets between runs; ``dataset_settings`` overrides
    fields of ``datasets.Settings`` (e.g. ``num_segments``); ``num_updates`` and
    ``eval_episodes`` override the budget of the mode.
    """
    import jax

    from rlx.agents import cpl
    from rlx.envs import registry

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache_dir) if cache_dir is not None else out_dir / "runs" / "datasets"
    budget = dict(QUICK if quick else FULL)
    budget.update({k: v for k, v in dict(num_updates=num_updates, eval_episodes=eval_episodes).items() if v})
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        from rlx.errors import UnknownNameError

        raise UnknownNameError("method", unknown[0], list(METHODS))
    started = time.time()
    rows, summaries = [], {}
    for env_key in envs:
        paths = datasets.make_datasets(env_key, levels, cache_dir, quick=quick, **(dataset_settings or {}))
        env, env_params = registry.make(datasets.ENVS[env_key].env_name)  # one object: compilations are reused
        for level in levels:
            dataset = datasets.load_dataset(paths[level])
            data = datasets.to_agent_data(dataset)
            summaries[f"{env_key}/{level}"] = datasets.summary(dataset)
            behaviour = np.asarray(dataset["source_returns"], np.float64) if "source_returns" in dataset else None
            for label in methods:
                config = cpl.Config(objective=METHODS[label], num_updates=budget["num_updates"], **LEARNER[env_key])
                cpl.validate(config)
                tick = time.time()
                keys = jax.random.split(jax.random.PRNGKey(1000), seeds)
                state, metrics = cpl.train(config, env, env_params, data, keys)
                eval_keys = jax.random.split(jax.random.PRNGKey(2000), seeds)
                returns = np.asarray(jax.vmap(lambda policy, key: cpl.evaluate(
                    config, env, env_params, policy, key, budget["eval_episodes"]))(state.policy, eval_keys))
                row = {
                    "env": env_key, "env_name": dataset["env"], "level": level, "method": label,
                    "objective": config.objective, "per_seed": returns.tolist(), "mean": float(returns.mean()),
                    "ci95": t_interval(returns),
                    "behaviour_return": None if behaviour is None else float(behaviour.mean()),
                    "final_loss": float(np.asarray(metrics["loss"])[:, -50:].mean()),
                    "seconds": time.time() - tick,
                    "config": {f.name: getattr(config, f.name) for f in dataclasses.fields(config)},
                }
                rows.append(row)
                print(f"[offline_study] {env_key:8s} {level:7s} {label:15s} {row['mean']:9.1f} ± {row['ci95']:.1f} "
                      f"({row['seconds']:.1f}s)", flush=True)
    info = {"quick": quick, "seeds": seeds, **budget, "envs": list(envs), "levels": list(levels),
            "seconds": time.time() - started, "generated": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    suffix = "_quick" if quick else ""
    (out_dir / f"offline{suffix}.json").write_text(
        json.dumps({"info": info, "rows": rows, "datasets": summaries}, indent=1, default=str))
    (out_dir / f"offline{suffix}.md").write_text(render(rows, summaries, info))
    return {"info": info, "rows": rows, "datasets": summaries}


def render(rows: list[dict], summaries: dict, info: dict) -> str:
    lines = ["# Offline preference learning: CPL vs behaviour cloning on rlx-made datasets "
             "(`python -m rlx.reproduce pbrl_offline`)", ""]
    if info["quick"]:
        lines += ["QUICK smoke test (small datasets, short training): these numbers mean nothing.", ""]
    lines += [
        f"Generated {info['generated']} by `rlx.pbrl.offline_study.run_study` in {info['seconds']:.0f} s: "
        f"{info['seeds']} seeds per learner, {info['num_updates']} gradient steps, greedy return over "
        f"{info['eval_episodes']} episodes per seed. Labels: oracle on summed true reward (CartPole: "
        "minus 1 per fall). *Data return*: mean return of the policies that made the dataset (sampled "
        "actions; for replay, the mean over its source policies). *Decided*: fraction of pairs that "
        "are not ties.", "",
        "| env | dataset | data return | decided | method | return (mean ± 95% CI) | per seed |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    for row in rows:
        summary = summaries[f"{row['env']}/{row['level']}"]
        data_return = "—" if row["behaviour_return"] is None else f"{row['behaviour_return']:.1f}"
        ci = "n/a" if np.isnan(row["ci95"]) else f"{row['ci95']:.1f}"
        per_seed = ", ".join(f"{v:.1f}" for v in row["per_seed"])
        lines.append(f"| {row['env_name']} | {row['level']} | {data_return} | {1 - summary['ties'] - summary['skipped']:.2f} | "
                     f"{row['method']} | {row['mean']:.1f} ± {ci} | {per_seed} |")
    return "\n".join(lines) + "\n"


def reproduce(out: Path, quick: bool, skip_training: bool = False) -> Path:
    """``python -m rlx.reproduce`` entry point; every learner trains each time (the datasets are cached)."""
    if skip_training:
        raise SystemExit("--skip-training: pbrl_offline keeps no trained learners to evaluate again; it trains "
                         "them each time (its datasets are cached)")
    run_study(out, quick=quick, seeds=2 if quick else 5)
    results = Path(out) / ("offline_quick.md" if quick else "offline.md")
    print(results.read_text())
    return results
