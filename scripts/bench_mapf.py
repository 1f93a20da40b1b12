"""Benchmark: agent-steps/s of rlx's MAPF environment vs POGEMA, random actions, soft collisions.

Usage::

    .venv/bin/python scripts/bench_mapf.py [--batches 1,16,128,1024] [--steps 128] [--quick]

In ONE invocation on the same machine:

* **rlx**: ``MapfEnv`` (soft collisions, ``nothing`` mode, observation radius 5) on a pool of 16
  random maps (density 0.3) that stores each entry's initial windows, as ``make_mapf`` builds its pools
  (``MapfEnv.with_initial_observations``), ``B`` environments under ``vmap``, ``--steps`` steps of uniformly
  random actions inside one jitted ``lax.scan`` (observations computed every step, auto-reset included,
  every output read: ``bench_common.action_rollout``); compiled and run once, then timed (median of 3, each
  the mean of enough calls to last 0.2 s). The actions are drawn before the timed runs, as POGEMA's are.
* **POGEMA 1.4**: ``pogema_v0`` with the same settings (one Python environment; POGEMA has no
  batching, so B environments cost B times one), median of 3 episodes, in its own virtualenv
  (``make pogema``) through scripts/pogema_driver.py.

Both compute every agent's 11x11x3 window every step: rlx's as 0/1 ``uint8``, POGEMA's as ``float32``.

Configurations: 32x32 with 64 agents and 64x64 with 256 agents. Prints a markdown table with
agent-steps/s and the ratio rlx / POGEMA, and writes it to ``.bench/bench_mapf.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

from bench_common import action_rollout, save_table, timed  # noqa: E402
from rlx.envs.mapf import instances  # noqa: E402
from rlx.envs.mapf.env import MapfEnv  # noqa: E402

POGEMA_PYTHON = ROOT / ".venv-pogema" / "bin" / "python"
CONFIGS = [(32, 64), (64, 256)]


def rlx_speed(side: int, agents: int, batch: int, steps: int) -> tuple[float, float]:
    """(compile seconds, agent-steps/s) of ``batch`` environments stepping ``steps`` times."""
    pool = instances.random_pool(16, agents, seed=0, size=(side, side), density=(0.3, 0.3),
                                 max_steps_in_episode=steps + 1)
    env = MapfEnv(agents, 5, "soft", "nothing", pool)
    pool = env.with_initial_observations(pool)

    # drawn before the timed runs, as POGEMA's driver draws its actions before its timed loop
    actions = jax.random.randint(jax.random.PRNGKey(1), (steps, batch, agents), 0, 5)
    compile_s, seconds, _ = timed(action_rollout(env, pool, batch), jax.random.PRNGKey(0), actions,
                                  min_seconds=0.2)  # small batches: several calls per timing
    return compile_s, batch * agents * steps / seconds


def pogema_speed(side: int, agents: int, steps: int) -> float | None:
    if not POGEMA_PYTHON.exists():
        return None
    out = subprocess.run([str(POGEMA_PYTHON), str(ROOT / "scripts" / "pogema_driver.py"), "speed", str(side),
                          str(agents), str(steps)], capture_output=True, text=True, check=True, timeout=1800)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,128,1024")
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="batches 1,4 and 16 steps: a smoke test")
    args = parser.parse_args()
    batches = [1, 4] if args.quick else [int(b) for b in args.batches.split(",")]
    steps = 16 if args.quick else args.steps
    started = datetime.datetime.now(datetime.timezone.utc)
    lines = [f"# MAPF environment stepping: rlx vs POGEMA ({started:%Y-%m-%d %H:%M} UTC)", "",
             f"machine: nproc {os.cpu_count()}, {platform.processor() or platform.machine()}, Python "
             f"{platform.python_version()}, jax {jax.__version__}; load average at start "
             f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", "",
             "| map | agents | POGEMA agent-steps/s | rlx envs | rlx compile s | rlx agent-steps/s | rlx / POGEMA |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for side, agents in CONFIGS:
        theirs = pogema_speed(side, agents, steps)
        print(f"pogema {side}x{side} {agents} agents: {theirs}", file=sys.stderr)
        for batch in batches:
            compile_s, ours = rlx_speed(side, agents, batch, steps)
            print(f"rlx {side}x{side} {agents} agents x {batch} envs: {ours:,.0f}", file=sys.stderr)
            ratio = f"{ours / theirs:,.1f}x" if theirs else "—"
            lines.append(f"| {side}x{side} | {agents} | {theirs:,.0f} | {batch} | {compile_s:.1f} | {ours:,.0f} | {ratio} |"
                         if theirs else f"| {side}x{side} | {agents} | — | {batch} | {compile_s:.1f} | {ours:,.0f} | — |")
    lines += ["", f"Random actions, soft collisions, `nothing` mode, observation radius 5 (11x11x3 windows "
              f"computed every step), density 0.3, {steps} steps. rlx: B environments under vmap in one jitted "
              "lax.scan, median of 3 timings (each at least 0.2 s of calls) after compiling, uint8 windows; "
              "both draw their random actions before timing; POGEMA 1.4.0: one environment stepped in Python "
              "(it does not batch), median of 3 episodes, its float32 observations included."]
    table = "\n".join(lines)
    print(table)
    save_table("bench_mapf", table)


if __name__ == "__main__":
    main()
