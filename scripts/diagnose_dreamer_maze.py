"""Why Dreamer does or does not learn the maze: its training metrics over one run of the generalization study.

Collects the study's uniformly random experience on N training levels (``rlx.imagination.generalization``),
trains ``rlx/agents/dreamer.py`` on it for G gradient steps with the study's settings (plus any overrides),
then prints the train-level return of the sampled policy and, for each tenth of training, the mean of the
world-model and actor-critic metrics ``train_step`` returns. What to look at: ``model_error_1step`` against
copying the last frame (about 0.006 on the maze), ``reward_error`` (the one-step *prior* reward error; the
sparse reward's variance is about 0.0018), and ``entropy`` (ln 4 = 1.386 is a uniform actor).

    .venv/bin/python scripts/diagnose_dreamer_maze.py --grad-steps 2500
    .venv/bin/python scripts/diagnose_dreamer_maze.py --grad-steps 6000 --set model_lr=3e-3 batch_size=16
"""

from __future__ import annotations

import argparse
import time

SHOWN = ("recon_loss", "reward_loss", "reward_error", "cont_loss", "kl", "model_error_1step", "imagined_return",
         "entropy", "critic_loss")


def parse_overrides(pairs: list[str]) -> dict:
    """``name=value`` pairs -> {name: value}, each value read as YAML (as Hydra reads ``algo.FIELD=VALUE``)."""
    import yaml

    return {name: yaml.safe_load(text) for name, _, text in (pair.partition("=") for pair in pairs)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grad-steps", type=int, default=2500)
    parser.add_argument("--levels", type=int, default=64, help="number of training levels N")
    parser.add_argument("--seed", type=int, default=64)
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="dreamer.Config overrides")
    args = parser.parse_args(argv)

    from rlx.runner import compile_cache

    compile_cache.set_xla_flags()
    import jax
    import numpy as np

    from rlx.agents import dreamer
    from rlx.envs import registry
    from rlx.imagination import generalization as study
    from rlx.runner.evaluation import evaluate
    from rlx.runner.loop import build_agent_config

    env, _ = registry.make("maze", None)
    from rlx.errors import ConfigError

    try:
        config = build_agent_config(dreamer, {**study.DREAMER, **parse_overrides(args.set)})
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    levels = study.level_params(env, args.levels)

    def run(key):
        agent = dreamer.make(config, env, levels)
        data_key, init_key, train_key, eval_key = jax.random.split(key, 4)
        state, metrics, dataset = study.train_on_random_experience(agent, (data_key, init_key, train_key),
                                                                   args.grad_steps, study.REAL_STEPS)
        returns = evaluate(agent, env, levels, state.policy, eval_key, study.EVAL_EPISODES, False, study.EVAL_STEPS)
        return returns.mean(), metrics, (dataset.reward > 0).mean()

    started = time.time()
    train_return, metrics, arrivals = jax.jit(run)(jax.random.PRNGKey(args.seed))
    metrics = jax.tree.map(np.asarray, metrics)
    print(f"train-level return {float(train_return):.3f}; goal arrivals {float(arrivals):.2%} of the data; "
          f"{time.time() - started:.0f} s")
    tenth = max(args.grad_steps // 10, 1)
    print("| steps | " + " | ".join(SHOWN) + " |")
    print("|---:|" + "---:|" * len(SHOWN))
    for first in range(0, args.grad_steps, tenth):
        window = slice(first, first + tenth)
        print(f"| {first}-{min(first + tenth, args.grad_steps)} | "
              + " | ".join(f"{metrics[name][window].mean():.4g}" for name in SHOWN) + " |")


if __name__ == "__main__":
    main()
