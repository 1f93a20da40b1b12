"""Benchmark: env steps/s of rlx's market-making environments, random actions and under PPO training.

Usage::

    .venv/bin/python scripts/bench_market.py [--batches 1,16,256,4096] [--steps 200] [--quick]

* **Random actions**: ``B`` environments under ``vmap``, ``--steps`` steps of uniformly random
  depths in [0, max_depth] inside one jitted ``lax.scan`` (gymnax ``step`` with auto-reset; the
  observations are consumed, so they are computed);
  compiled first, then timed (median of 3 repeats).
* **PPO training**: the ``ppo_market_quoting`` preset's PPO (32 envs x 256 steps, 4 epochs x 8
  minibatches, one seed) for a fixed number of updates after compiling; env steps/s of the whole
  update (collection plus learning).
* **Order book** (``market_book``): 8 synthetic days (2 h of 1-s snapshots each, 15 levels, window
  of 10 decisions), time-based (a decision every 10 s) and event-based (every 2 bps mid move)
  stepping, random actions at the same batch sizes, then PPO training as above.

Prints a markdown table and writes it to ``.bench/bench_market.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from bench_common import random_rollout, save_table, timed  # noqa: E402
from rlx.agents import ppo  # noqa: E402
from rlx.envs import registry  # noqa: E402
from rlx.envs.market import book, synthetic  # noqa: E402

QUOTING_PARAMS = dict(inventory_penalty=2.0, terminal_penalty=2.0, max_inventory=10.0)


def random_stepping(env, params, batch: int, steps: int) -> tuple[float, float]:
    """(compile seconds, env steps/s) of ``batch`` environments under random actions."""
    space = env.action_space(params)
    rollout = random_rollout(env, params, batch, steps, lambda key: jax.vmap(space.sample)(jax.random.split(key, batch)))
    compile_s, seconds, _ = timed(rollout, jax.random.PRNGKey(0))
    return compile_s, batch * steps / seconds


def ppo_training(env, params, updates: int) -> tuple[float, float]:
    """(compile seconds, env steps/s) of the ppo_market_quoting preset's PPO, one seed."""
    config = ppo.Config(num_envs=32, num_steps=256, num_epochs=4, num_minibatches=8, lr=1e-3, ent_coef=0.0,
                        gamma=1.0, normalize_rewards=True, total_timesteps=32 * 256 * updates)
    agent = ppo.make(config, env, params)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    compile_s, seconds, _ = timed(lambda s: jax.lax.scan(lambda c, _: agent.update(c), s, None, updates)[0], state)
    return compile_s, 32 * 256 * updates / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,256,4096")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="batches 1,64 and 2 PPO updates")
    args = parser.parse_args()
    batches = [1, 64] if args.quick else [int(b) for b in args.batches.split(",")]
    updates = 2 if args.quick else args.updates

    env, params = registry.make("market_quoting", **QUOTING_PARAMS)
    rows = []
    for batch in batches:
        compile_s, speed = random_stepping(env, params, batch, args.steps)
        rows.append(("model-based quoting (`market_quoting`), random actions", batch, compile_s, speed))
        print(rows[-1], flush=True)
    compile_s, speed = ppo_training(env, params, updates)
    rows.append(("model-based quoting, PPO training (preset network and batch)", 32, compile_s, speed))

    days = synthetic.generate_days(2 if args.quick else 8, seed=0)
    for stepping in ("time", "event"):
        book_params = book.build_params(days, stepping, interval=10.0, threshold_bps=2.0)
        book_env = book.BookEnv(book_params, window=10)
        label = f"order book (`market_book`), {stepping}-based, random actions"
        for batch in batches:
            compile_s, speed = random_stepping(book_env, book_params, batch, args.steps)
            rows.append((label, batch, compile_s, speed))
            print(rows[-1], flush=True)
        compile_s, speed = ppo_training(book_env, book_params, updates)
        rows.append((f"order book, {stepping}-based, PPO training", 32, compile_s, speed))
        print(rows[-1], flush=True)

    load = os.getloadavg()[0]
    lines = [
        f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} on {os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), jax {jax.__version__}, load average {load:.1f} at the end.",
        "", "| environment | parallel envs | compile s | env steps/s |", "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {batch} | {compile_s:.1f} | {speed:,.0f} |" for name, batch, compile_s, speed in rows]
    table = "\n".join(lines)
    print(table)
    save_table("bench_market", table)


if __name__ == "__main__":
    main()
