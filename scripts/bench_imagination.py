"""Benchmark: imagined versus real transitions per second, and time per update, of the world-model agents.

Usage::

    .venv/bin/python scripts/bench_imagination.py [--seeds 4] [--repeats 3] [--skip-presets]

For each world-model agent (``rlx/agents/dyna_ppo.py`` and ``rlx/agents/dreamer.py``, CartPole-v1,
each with the settings of its ``*_cartpole`` preset), in one run on this machine:

* imagined transitions/s: the agent's ``imagine`` alone, from a batch of start states, with the
  current (untrained) model and policy -- what one imagined step costs;
* real env steps/s: as many CartPole environments as imagination has start states (the batch column),
  stepping under ``vmap`` with random actions in one ``lax.scan`` -- what one real step costs at the
  same batch size, so the ratio compares equal batches;
* seconds per update (collect real steps, train the model, learn in imagination), ``--seeds`` seeds
  vmapped in one program, and how many real env steps per second training consumes;
* compile seconds of each preset as ``python -m rlx.train +exp=PRESET`` reports them in
  ``summary.json`` (``compile_seconds``) with the persistent compile cache off (``--skip-presets``
  leaves this out). The issue's target is under 90 s per preset. GPU presets are compiled for this
  machine's CPU without running (their update program, ``vmap`` over the preset's seeds, lowered from
  abstract shapes), since running one on the CPU runs out of memory.

Prints a markdown table and writes it to ``.bench/bench_imagination.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rlx.runner import compile_cache  # noqa: E402

compile_cache.set_xla_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from bench_common import checksum, random_rollout, save_table, timed  # noqa: E402
from gymnax.environments.classic_control.cartpole import CartPole  # noqa: E402

from rlx.agents import dyna_ppo  # noqa: E402

UPDATES = 8  # updates per timed program
PRESETS = ("dyna_ppo_cartpole", "dyna_ppo_acrobot", "dreamer_cartpole", "dreamer_maze")  # CPU presets
GPU_PRESETS = ("dreamer_maze_gpu",)  # compiled here, not run: one update of its 4 seeds needs over 20 GB


def dyna_imagination(env):
    """``(imagine_fn, start_obs, imagined transitions per call)`` for dyna_ppo with its CartPole settings."""
    config = dyna_ppo.cartpole_config()
    agent = dyna_ppo.make(config, env, env.default_params)
    state = agent.init(jax.random.PRNGKey(0))
    start_obs = jax.vmap(lambda k: env.reset(k, env.default_params)[0])(
        jax.random.split(jax.random.PRNGKey(1), config.num_branches))

    def run(obs, key):
        return checksum(agent.imagine(state.world_model, state.policy, obs, config.horizon, key))  # all of it

    return config, agent, (lambda obs: run(obs, jax.random.PRNGKey(2))), start_obs, config.num_branches * config.horizon


def dreamer_imagination(env):
    """The same for dreamer: imagine from posterior states of a batch of replayed sequences."""
    from rlx.agents import dreamer

    config = dreamer.cartpole_config()
    agent = dreamer.make(config, env, env.default_params)
    state, data = agent.collect(agent.init(jax.random.PRNGKey(0)), None, config.seq_len)  # random-action data
    state = agent.fill(state, data)
    starts = agent.start_states(state, jax.random.PRNGKey(1))  # every posterior state of one sampled batch

    def run(starts):
        return checksum(agent.imagine(state.model_params, state.policy, starts, config.horizon, jax.random.PRNGKey(2)))

    count = jax.tree_util.tree_leaves(starts)[0].shape[0] * config.horizon
    return config, agent, run, starts, count


def transition_rates(env, imagine_fn, starts, imagined: int, repeats: int) -> dict:
    """Imagined transitions/s of ``imagine_fn(starts)`` (``imagined`` per call), and real env steps/s of a random
    rollout with as many environments as imagination has start states (the leading dimension of ``starts``),
    so that the two rates compare equal batches."""
    imagine_compile, imagine_s, _ = timed(imagine_fn, starts, repeats=repeats)
    batch = jax.tree_util.tree_leaves(starts)[0].shape[0]
    steps = max(1, 100_000 // batch)
    rollout = random_rollout(env, env.default_params, batch, steps,
                             lambda key: jax.random.randint(key, (batch,), 0, 2))
    _, real_s, _ = timed(rollout, jax.random.PRNGKey(0), repeats=repeats)
    return {"batch": batch, "imagined/s": imagined / imagine_s, "real/s": batch * steps / real_s,
            "imagine_compile": imagine_compile}


def measure(name: str, build, seeds: int, repeats: int) -> dict:
    """One row: imagined and real transitions/s at the same batch, seconds per update, real steps/s consumed
    by training."""
    env = CartPole()
    config, agent, imagine_fn, starts, imagined = build(env)
    rates = transition_rates(env, imagine_fn, starts, imagined, repeats)

    def updates(keys):
        def one_seed(key):
            state = agent.init(key)
            return jax.lax.scan(lambda s, _: (agent.update(s)[0], None), state, None, UPDATES)[0]
        return jax.vmap(one_seed)(keys)

    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    update_compile, update_s, _ = timed(updates, keys, repeats=repeats)
    real_per_update = config.num_envs * config.num_steps
    return {"agent": name, **rates, "s/update": update_s / UPDATES,
            "train real/s": seeds * real_per_update * UPDATES / update_s, "train_ratio": float(config.train_ratio),
            "compile": update_compile + rates["imagine_compile"]}


def preset_compile_seconds(preset: str) -> float | None:
    """``compile_seconds`` of ``python -m rlx.train +exp=preset``, cut to two updates, with the compile cache off."""
    from rlx.imagination.sample_efficiency import preset_parts

    config = preset_parts(preset)[1]
    two_updates = 2 * config.num_envs * config.num_steps
    with tempfile.TemporaryDirectory() as run_dir:
        done = subprocess.run([sys.executable, "-m", "rlx.train", f"+exp={preset}", "run.compile_cache=null",
                               f"algo.total_timesteps={two_updates}", f"hydra.run.dir={run_dir}", "logger=none"],
                              cwd=ROOT, capture_output=True, text=True)
        summary = Path(run_dir) / "summary.json"
        if done.returncode != 0 or not summary.is_file():
            print(f"{preset}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            return None
        return json.loads(summary.read_text())["compile_seconds"]


def preset_update_compile_seconds(preset: str, seeds: int = 4) -> float:
    """Seconds to compile ``preset``'s update (``seeds`` vmapped; 4 as the GPU preset runs) for this machine,
    from shapes alone."""
    from rlx.imagination.sample_efficiency import preset_parts

    module, config, env, params = preset_parts(preset)
    agent = module.make(config, env, params)
    state = jax.eval_shape(jax.vmap(agent.init), jax.random.split(jax.random.PRNGKey(0), seeds))
    started = time.time()
    jax.jit(jax.vmap(lambda s: agent.update(s)[0])).lower(state).compile()
    return time.time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-presets", action="store_true")
    args = parser.parse_args()
    builders = {"dyna_ppo": dyna_imagination, "dreamer": dreamer_imagination}
    rows = [measure(name, build, args.seeds, args.repeats) for name, build in builders.items()]
    lines = [f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC} on {os.cpu_count()} CPU "
             f"cores, jax {jax.__version__}; CartPole-v1, each agent's cartpole preset settings, {args.seeds} seeds "
             f"vmapped, median of {args.repeats}.", "",
             "| agent | batch (imagined start states = real envs) | imagined transitions/s | "
             "real env steps/s (that batch of envs, random actions) | imagined / real | "
             "s per update | real steps/s consumed by training | train_ratio | compile s (update + imagine) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['agent']} | {row['batch']} | {row['imagined/s']:,.0f} | {row['real/s']:,.0f} | "
                     f"{row['imagined/s'] / row['real/s']:.2f}x | {row['s/update']:.3f} | {row['train real/s']:,.0f} | "
                     f"{row['train_ratio']:g} | {row['compile']:.1f} |")
    if not args.skip_presets:
        lines += ["", "Compile seconds per preset (`python -m rlx.train +exp=PRESET run.compile_cache=null`, "
                  "summary.json; target < 90 s):", "", "| preset | compile s |", "|---|---:|"]
        for preset in PRESETS:
            seconds = preset_compile_seconds(preset)
            lines.append(f"| {preset} | {'failed' if seconds is None else f'{seconds:.1f}'} |")
        for preset in GPU_PRESETS:
            lines.append(f"| {preset} (update program only, compiled for the CPU, not run) | "
                         f"{preset_update_compile_seconds(preset):.1f} |")
    table = "\n".join(lines)
    print(table)
    save_table("bench_imagination", table)


if __name__ == "__main__":
    main()
