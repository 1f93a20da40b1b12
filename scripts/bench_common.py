"""Helpers shared by the ``scripts/bench_*.py`` benchmarks (run as scripts, so this folder is on ``sys.path``).

JAX is imported inside the functions that need it, so that ``bench_ppo.py`` and ``bench_sweep.py``
(which only launch processes) can use ``median_run`` without starting JAX.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, *args, repeats: int = 3, warmup: int = 1, min_seconds: float = 0.0):
    """``(compile seconds, median run seconds, last output)`` of ``jax.jit(fn)(*args)``, compiled ahead of time.

    After compiling, ``warmup`` untimed runs (first-call allocations, page faults, thread start-up)
    precede the ``repeats`` timed ones. With ``min_seconds``, each timing is the mean of as many calls as
    last that long by the last warm-up run's duration (short programs: one call is too brief to time).
    """
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    warm_s = 0.0
    for _ in range(warmup):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        warm_s = time.perf_counter() - start
    calls = max(1, math.ceil(min_seconds / warm_s)) if min_seconds and warm_s else 1
    runs, output = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            output = jax.block_until_ready(compiled(*args))
        runs.append((time.perf_counter() - start) / calls)
    return compile_s, statistics.median(runs), output


def checksum(tree):
    """One float32 scalar that reads every element of every leaf of ``tree`` (arrays, PRNG keys, ints, bools).

    Return it from a timed program so the compiler cannot drop any of the work that produced ``tree``:
    a program that returns only part of its results (say the rewards) is free to skip computing the rest.
    """
    import jax
    import jax.numpy as jnp

    total = jnp.zeros((), jnp.float32)
    for leaf in jax.tree.leaves(tree):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        total = total + leaf.astype(jnp.float32).sum()
    return total


def median_run(runs: list[dict], key: str) -> dict:
    """The run whose ``key`` is the median of ``runs``, whole, so that its fields stay consistent with each other.

    Taking each field's median separately mixes runs (and a difference of two such medians, like an
    "other" time, can come out negative). With an even number of runs, the lower of the two middle
    ones in sorted order. A run whose ``key`` is None (e.g. never reached the threshold) sorts last, as
    the slowest. The result adds ``repeats`` (how many runs) and ``missing`` (how many had ``key`` None).
    """
    if not runs:
        raise ValueError("median_run: no runs")
    ordered = sorted(runs, key=lambda run: math.inf if run.get(key) is None else run[key])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen.update(repeats=len(runs), missing=sum(run.get(key) is None for run in runs))
    return chosen


def save_table(name: str, table: str) -> Path:
    """Write a benchmark's markdown table to ``.bench/<name>.md``."""
    out = ROOT / ".bench" / f"{name}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(table.rstrip("\n") + "\n")
    return out


def random_rollout(env, params, batch: int, steps: int, sample_actions):
    """``rollout(key) -> scalar``: ``batch`` environments under ``vmap`` take ``steps`` random steps in one ``lax.scan``.

    ``sample_actions(key)`` returns the batch's actions, drawn inside the timed program. The scalar is the
    ``checksum`` of every step's outputs (observations, rewards, flags, info) and of the final states, so
    the compiler must compute every observation element of every environment: a sum of a few entries
    would let it skip the rest of the observation work, which is most of a grid environment's step.
    """
    return lambda key: _scanned_steps(env, params, batch, key, lambda action_key, _: sample_actions(action_key),
                                      None, steps)


def action_rollout(env, params, batch: int):
    """``rollout(key, actions) -> scalar``: as ``random_rollout``, but the environments step through
    ``actions`` (``[steps, batch, ...]``) drawn beforehand, for comparing with a peer that draws its random
    actions before its timed loop: passed in, they are not drawn inside the timed program either."""
    return lambda key, actions: _scanned_steps(env, params, batch, key, lambda _, given: given, actions, None)


def _scanned_steps(env, params, batch, key, actions_of, xs, steps):
    import jax

    reset_key, key = jax.random.split(key)
    _, states = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, batch), params)

    def step(carry, x):
        states, key = carry
        key, action_key, step_key = jax.random.split(key, 3)
        outputs = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, batch), states, actions_of(action_key, x), params)
        return (outputs[1], key), checksum((outputs[0],) + tuple(outputs[2:]))

    (states, _), sums = jax.lax.scan(step, (states, key), xs, length=steps)
    return sums.sum() + checksum(states)
