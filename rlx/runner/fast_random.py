"""JAX's random numbers on a CPU without the rolled loop in their hash: the same bits, sooner.

Every ``jax.random`` call (split, uniform, categorical, ...) runs the threefry2x32 hash. On
the CPU, JAX lowers that hash as a five-iteration ``while`` loop, which keeps compiling quick;
on GPUs it writes the rounds out in a straight line. An RL rollout makes a few such calls per
environment step on a handful of values each, so on a CPU the loop's per-iteration kernels,
not the arithmetic, are what it pays for: PPO's rollout step on CartPole compiled to five
of these loops around a body of about 150 operations.

``use_straight_line_threefry()`` gives the CPU the straight-line lowering. It is the same hash,
so every random number is bit for bit what it was (``tests/test_fast_random.py``), and so was a
whole PPO run we compared at XLA's default settings (returns, losses). Under other compiler flags
(the test suite's backend optimisation level 0) XLA may fuse the surrounding arithmetic
differently: the same tiny run's loss then moved in the sixth digit.

Measured on 2 CPU cores at the PPO benchmark configuration (CartPole, 4 envs x 128 steps, 4 epochs
x 4 minibatches), alternating runs: 76k -> 104-109k env steps/s at XLA's defaults with the same
compile time (7.5-8.2 s against 8.1-8.2 s), and 18.5-20.6k -> 24.6-27.7k under the test suite's
fast-compile flags (compile 3.4-3.6 s against 2.5-3.4 s).

It uses JAX internals (the ``threefry2x32`` primitive and its GPU lowering rule); on a JAX
without them it changes nothing and says so by returning False. It does the same on JAX releases
newer than ``NEWEST_MEASURED_JAX``: jax 0.11.2's XLA compiles the straight-line rounds far more slowly
on the CPU (the runner's evaluation program of ``+exp=ppo_cartpole`` had not compiled after 300 s with
them, and took 1 s without; 2 cores, 2026-12-04), so there the rolled loop stays.
"""

from __future__ import annotations

NEWEST_MEASURED_JAX = (0, 10)  # (major, minor): the newest release line this lowering was measured to help


def jax_release() -> tuple[int, int]:
    """``(major, minor)`` of the installed JAX."""
    import jax

    major, minor = jax.__version__.split(".")[:2]
    return int(major), int(minor)


def use_straight_line_threefry() -> bool:
    """Lower threefry2x32 on the CPU like on GPUs (straight-line rounds); True once in effect.

    Affects programs lowered afterwards; call it before compiling. Calling it again is harmless.
    """
    if jax_release() > NEWEST_MEASURED_JAX:
        return False
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as threefry

        primitive, rule = threefry.threefry2x32_p, threefry._threefry2x32_lowering_rule
    except (ImportError, AttributeError):
        return False
    mlir.register_lowering(primitive, rule, platform="cpu")
    return True
