"""Helpers shared by the ``scripts/bench_*.py`` benchmarks (run as scripts, so this folder is on ``sys.path``)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, *args, repeats: int = 3):
    """``(compile seconds, median run seconds, last output)`` of ``jax.jit(fn)(*args)``, compiled ahead of time."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    runs, output = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        output = jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - start)
    return compile_s, statistics.median(runs), output


def save_table(name: str, table: str) -> Path:
    """Write a benchmark's markdown table to ``.bench/<name>.md``."""
    out = ROOT / ".bench" / f"{name}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(table.rstrip("\n") + "\n")
    return out


def random_rollout(env, params, batch: int, steps: int, sample_actions):
    """``rollout(key) -> scalar``: ``batch`` environments under ``vmap`` take ``steps`` random steps in one ``lax.scan``.

    ``sample_actions(key)`` returns the batch's actions. The scalar sums the rewards and one
    observation entry per environment, so the compiler cannot drop the observation work.
    """

    def rollout(key):
        reset_key, key = jax.random.split(key)
        _, states = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, batch), params)

        def step(carry, _):
            states, key = carry
            key, action_key, step_key = jax.random.split(key, 3)
            obs, states, rewards, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, batch), states, sample_actions(action_key), params)
            return (states, key), rewards.sum() + obs.reshape(batch, -1)[:, 0].sum()

        return jax.lax.scan(step, (states, key), None, steps)[1].sum()

    return rollout
