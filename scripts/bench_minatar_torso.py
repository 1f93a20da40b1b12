"""Benchmark: PPO training speed on Breakout-MinAtar with the MLP and the CNN torso (rlx/agents/ppo.py).

Usage::

    .venv/bin/python scripts/bench_minatar_torso.py [--torsos mlp,cnn] [--updates 2]

The ``ppo_minatar`` preset's configuration (64 envs x 128 steps, 4 epochs x 8 minibatches,
256x256 ReLU), one seed on one device: compiles ``--updates`` updates, runs them once to warm
up, then times one more run and prints env steps per second for each torso.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rlx.runner import compile_cache  # noqa: E402

compile_cache.set_xla_flags()  # before JAX starts: the jaxlib 0.10 scheduler workaround

import jax  # noqa: E402

from rlx.agents import ppo  # noqa: E402
from rlx.envs import registry  # noqa: E402


def steps_per_second(torso: str, updates: int) -> float:
    env, params = registry.make("Breakout-MinAtar")
    config = ppo.Config(total_timesteps=10_002_432, num_envs=64, num_steps=128, num_epochs=4, num_minibatches=8,
                        hidden_sizes=(256, 256), activation="relu", torso=torso, lr=5e-4)
    agent = ppo.make(config, env, params)
    state = jax.jit(agent.init)(jax.random.PRNGKey(0))
    run = jax.jit(lambda s: jax.lax.scan(lambda s, _: agent.update(s), s, None, updates)).lower(state).compile()
    jax.block_until_ready(run(state))
    start = time.perf_counter()
    jax.block_until_ready(run(state))
    return updates * config.batch_size / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torsos", default="mlp,cnn")
    parser.add_argument("--updates", type=int, default=2)
    args = parser.parse_args()
    print(f"| torso | env steps/s (1 seed, {jax.default_backend()}) |\n|---|---:|")
    for torso in args.torsos.split(","):
        print(f"| {torso} | {steps_per_second(torso, args.updates):,.0f} |", flush=True)


if __name__ == "__main__":
    main()
