"""Benchmark: wall time of preference-based PPO against plain PPO, same env steps and seeds, one run.

Usage::

    .venv/bin/python scripts/bench_pbrl.py [--seeds 4] [--repeats 3]

Both train CartPole-v1 with the ``pref_ppo_cartpole`` preset's PPO settings (122,880 env steps =
240 updates of 8 envs x 64 steps, ``--seeds`` seeds vmapped in one program): plain PPO
(``rlx/agents/ppo.py``) on the true reward, preference PPO (``rlx/agents/pref_ppo.py``) on a reward
model learned from at most 100 oracle labels (3-member ensemble; 10 feedback rounds of 10 queries,
one every 19 updates over the first 80% of training; each round takes 25 Adam steps on 16 labelled
pairs; see ``conf/exp/pref_ppo_cartpole.yaml`` and ``pref_ppo.cartpole_config``). A third row with
10 reward-model steps per round shows what the reward model costs. Each is compiled first, run once
untimed, then timed (median of ``--repeats``). Prints a markdown table with the ratio (target:
preference PPO at most 1.5x plain PPO) and writes it to ``.bench/bench_pbrl.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlx.runner import compile_cache  # noqa: E402

compile_cache.set_xla_flags()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from bench_common import save_table, timed  # noqa: E402
from gymnax.environments.classic_control.cartpole import CartPole  # noqa: E402

from rlx.agents import ppo, pref_ppo  # noqa: E402

# The pref_ppo_cartpole preset's PPO settings, for both agents
PRESET = pref_ppo.cartpole_config()
SHARED = {name: getattr(PRESET, name) for name in ("total_timesteps", "num_envs", "num_steps", "lr", "ent_coef",
                                                    "gamma", "gae_lambda", "normalize_rewards")}


def timed_training(module, config, seeds: int, repeats: int):
    """(compile seconds, median run seconds, mean true return of the last 10 updates per seed)."""
    env = CartPole()
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    train = jax.vmap(lambda key: module.train(config, env, env.default_params, key)[1]["train_return"])
    compile_s, seconds, returns = timed(train, keys, repeats=repeats)
    return compile_s, seconds, np.asarray(returns)[:, -10:].mean(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = {
        "plain PPO (true reward)": timed_training(ppo, ppo.Config(**SHARED), args.seeds, args.repeats),
        "preference PPO (<= 100 oracle labels)": timed_training(pref_ppo, PRESET, args.seeds, args.repeats),
        "preference PPO, 10 reward-model steps per round (preset: 25)": timed_training(
            pref_ppo, pref_ppo.cartpole_config(reward_steps=10), args.seeds, args.repeats),
    }
    base = rows["plain PPO (true reward)"][1]
    lines = [f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} on {os.cpu_count()} CPU "
             f"cores, jax {jax.__version__}; CartPole-v1, {SHARED['total_timesteps']:,} env steps x {args.seeds} seeds "
             f"in one program, median of {args.repeats}.", "",
             "| agent | compile s | run s | / plain PPO | true return, last 10 updates (per seed) |",
             "|---|---:|---:|---:|---|"]
    for label, (compile_s, run_s, returns) in rows.items():
        lines.append(f"| {label} | {compile_s:.1f} | {run_s:.2f} | {run_s / base:.2f}x | "
                     f"{', '.join(f'{r:.0f}' for r in returns)} |")
    table = "\n".join(lines)
    print(table)
    save_table("bench_pbrl", table)


if __name__ == "__main__":
    main()
