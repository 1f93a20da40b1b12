"""World-model prediction error against horizon: ``python -m rlx.reproduce imagination_model_error [--quick]``.

Trains each world model on uniformly random experience, then measures on *fresh* random sequences the
open-loop error of predicting ``h`` steps ahead from real actions alone (after ``CONTEXT`` observed steps):
the mean squared error per observation feature, in the observation's own units, for h = 1 .. 15.

* ``dreamer`` (RSSM, ``rlx/agents/dreamer.py``) on CartPole-v1 and on the maze (64 training levels, errors
  on training levels and on unseen levels; the spatial RSSM of the generalization study and the flat one),
  ``train_from_dataset`` for ``GRAD_STEPS`` steps;
* ``dyna_ppo``'s ensemble (``rlx/agents/dyna_ppo.py``) on CartPole-v1, trained by the ``dyna_ppo_cartpole``
  preset's settings (its own experience, not the random data), each step through a random member;
* "copy the last observation" as the reference a model must beat.

Also reports the world models' reward error (squared, one step) on the same held-out data where the agent
measures it. Writes ``experiments/imagination/model_error.md``, ``.json`` and ``model_error.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlx.imagination import measured_on, read_saved, save_json, today

EXPERIMENT_DIR = "imagination"
HORIZONS = (1, 2, 3, 5, 8, 12, 15)
CONTEXT = 8  # observed steps before the open-loop prediction starts
HELD_OUT_ENVS = 250  # a multiple of dyna_ppo's 5 ensemble members (each row goes through one)
GRAD_STEPS = 2_000
REAL_STEPS = 16_384
SEEDS = 2


def maze_models() -> dict:
    """Dreamer settings per maze world model: the generalization study's spatial RSSM, and the flat one (the
    grid flattened into MLPs, the study's model until 2026-12-02)."""
    from rlx.imagination import generalization

    flat = {k: v for k, v in generalization.DREAMER.items() if k not in generalization.SPATIAL_MODEL}
    return {"spatial RSSM": dict(generalization.DREAMER), "flat RSSM": flat}


def held_out(config, env, params, key):
    """Fresh random-action sequences ``[CONTEXT + max(HORIZONS), HELD_OUT_ENVS]`` in dreamer's Dataset format."""
    from rlx.agents import dreamer

    config = config.replace(num_envs=HELD_OUT_ENVS)
    return dreamer.collect(config, env, params, key, CONTEXT + max(HORIZONS))


def per_horizon(errors, is_first):
    """Mean of ``errors[h - 1]`` (``[max(HORIZONS), B]``) over the sequences with no episode start in the
    first ``h`` predicted steps, for each ``h`` in ``HORIZONS``. ``is_first``: those steps' flags. NaN at a
    horizon no sequence reaches within its episode: there is no error to report, and 0 would read as exact."""
    import jax.numpy as jnp

    alive = still_alive(is_first)
    counts = horizon_counts(alive)
    sums = jnp.stack([(errors[h - 1] * alive[h - 1]).sum() for h in HORIZONS])
    return jnp.where(counts > 0, sums / jnp.maximum(counts, 1.0), jnp.nan)


def still_alive(is_first):
    """``[max(HORIZONS), B]``: 1 while a sequence has had no episode start among the predicted steps so far."""
    import jax.numpy as jnp

    return jnp.cumprod(1.0 - jnp.asarray(is_first, jnp.float32), 0)


def horizon_counts(alive):
    """For each ``h`` in ``HORIZONS``, how many sequences ``still_alive`` through the first ``h`` predicted steps:
    the sequences each horizon's error is averaged over."""
    import jax.numpy as jnp

    return jnp.stack([alive[h - 1].sum() for h in HORIZONS])


def counted_sequences(data) -> list[int]:
    """``horizon_counts`` of held-out ``data`` (its steps after the ``CONTEXT`` observed ones), as ints."""
    return [int(c) for c in horizon_counts(still_alive(np.asarray(data.is_first[CONTEXT:CONTEXT + max(HORIZONS)])))]


def copy_last_error(data) -> np.ndarray:
    """Error per horizon of predicting that the observation stays as it was at ``CONTEXT - 1``."""
    obs = np.asarray(data.obs, np.float64).reshape(data.obs.shape[:2] + (-1,))
    errors = ((obs[CONTEXT:] - obs[CONTEXT - 1]) ** 2).mean(-1)
    return np.asarray(per_horizon(errors, np.asarray(data.is_first[CONTEXT:], np.float64)), np.float64)


def dreamer_errors(config, env, train_params, evaluations: dict, grad_steps: int, real_steps: int, seeds: int):
    """``{data label: [seeds, horizons]}`` open-loop errors of dreamer trained on random data of ``train_params``."""
    import jax

    from rlx.agents import dreamer

    agent = dreamer.make(config, env, train_params)

    def run(key):
        data_key, train_key = jax.random.split(key)
        dataset = agent.collect(agent.init(data_key), None, real_steps // config.num_envs)[1]
        state, metrics = dreamer.train_from_dataset(config, env, train_params, dataset, train_key, grad_steps)
        errors = {label: agent.multistep_error(state.learner.model, data, HORIZONS, CONTEXT)
                  for label, data in evaluations.items()}
        return errors, metrics["reward_error"][-100:].mean()

    errors, reward_error = jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(3), seeds))
    return {label: np.asarray(e, np.float64) for label, e in errors.items()}, np.asarray(reward_error, np.float64)


def dyna_errors(data, seeds: int, quick: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Open-loop errors ``[seeds, horizons]`` of the ``dyna_ppo_cartpole`` ensemble, and its last reward_mse
    (``quick``: 4,096 real steps instead of the preset's 20,480, as the efficiency study's quick runs)."""
    import jax
    import jax.numpy as jnp

    from rlx.imagination.sample_efficiency import preset_parts

    module, config, env, params = preset_parts("dyna_ppo_cartpole", ("algo.total_timesteps=4096",) if quick else ())
    agent = module.make(config, env, params)
    max_h = max(HORIZONS)

    def run(key):
        state, metrics = module.train(config, env, params, key)
        start = data.obs[CONTEXT - 1].astype(jnp.float32)

        def step(obs, inputs):
            action, key = inputs
            next_obs, _, _ = agent.model_step(state.model_params, state.model_stats, obs, action, key)
            return next_obs, next_obs

        keys = jax.random.split(jax.random.PRNGKey(5), max_h)
        _, predictions = jax.lax.scan(step, start, (data.action[CONTEXT:CONTEXT + max_h], keys))
        errors = ((predictions - data.obs[CONTEXT:CONTEXT + max_h]) ** 2).mean(-1)
        return per_horizon(errors, data.is_first[CONTEXT:CONTEXT + max_h]), metrics["reward_mse"][-1]

    errors, reward = jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(4), seeds))
    return np.asarray(errors, np.float64), np.asarray(reward, np.float64)


def measure(quick: bool) -> dict:
    import jax

    from rlx.agents import dreamer
    from rlx.envs import registry
    from rlx.imagination import generalization

    grad_steps, real_steps, seeds = (20, 2048, 2) if quick else (GRAD_STEPS, REAL_STEPS, SEEDS)
    rows = {}
    cartpole, cartpole_params = registry.make("CartPole-v1")
    config = dreamer.cartpole_config(num_envs=32, num_steps=16, capacity_steps=real_steps // 32)
    data = held_out(config, cartpole, cartpole_params, jax.random.PRNGKey(100))
    rows["CartPole-v1: copy the last observation"] = copy_last_error(data)[None]
    errors, reward = dreamer_errors(config, cartpole, cartpole_params, {"held out": data}, grad_steps, real_steps,
                                    seeds)
    rows["CartPole-v1: dreamer (RSSM)"] = errors["held out"]
    rows["CartPole-v1: dyna_ppo ensemble (its preset's own experience)"], dyna_reward = dyna_errors(data, seeds, quick)
    maze_env, _ = registry.make("maze")
    train_params = generalization.level_params(maze_env, 64)
    test_params = generalization.level_params(maze_env, 0, generalization.TEST_OFFSET)
    maze_config = dreamer.Config(**generalization.DREAMER).replace(capacity_steps=real_steps // 32)
    evaluations = {"training levels": held_out(maze_config, maze_env, train_params, jax.random.PRNGKey(101)),
                   "unseen levels": held_out(maze_config, maze_env, test_params, jax.random.PRNGKey(102))}
    rows["maze: copy the last observation"] = copy_last_error(evaluations["unseen levels"])[None]
    counts = {"CartPole-v1, held out": counted_sequences(data),
              **{f"maze, {label}": counted_sequences(held) for label, held in evaluations.items()}}
    reward_errors = {"CartPole-v1: dreamer (RSSM), training batches, squared": reward.tolist(),
                     "CartPole-v1: dyna_ppo, held-out slice, squared": dyna_reward.tolist()}
    for kind, config in maze_models().items():  # the study's spatial RSSM, and the flat one it replaced
        config = dreamer.Config(**config).replace(capacity_steps=real_steps // 32)
        maze_errors, maze_reward = dreamer_errors(config, maze_env, train_params, evaluations, grad_steps,
                                                  real_steps, seeds)
        for label, values in maze_errors.items():
            rows[f"maze: dreamer ({kind}), {label}"] = values
        reward_errors[f"maze: dreamer ({kind}), training batches, squared"] = maze_reward.tolist()
    return {"horizons": list(HORIZONS), "rows": {k: v.tolist() for k, v in rows.items()},
            "reward_error": reward_errors, "sequences_per_horizon": counts,
            "settings": {"quick": quick, "grad_steps": grad_steps, "real_steps": real_steps, "seeds": seeds,
                         "measured": today()}}


def markdown(results: dict) -> str:
    settings = results["settings"]
    lines = [f"Measured {measured_on(settings.get('measured'))} on this machine's CPU"
             f"{' (--quick: tiny budgets, the numbers mean nothing)' if settings['quick'] else ''}: open-loop "
             f"prediction error (mean squared error per observation feature) h steps after {CONTEXT} observed "
             f"steps, on {HELD_OUT_ENVS} fresh random-action sequences; dreamer trained {settings['grad_steps']:,} "
             f"steps on {settings['real_steps']:,} random steps; mean over {settings['seeds']} seeds.", "",
             "| model, data | " + " | ".join(f"h={h}" for h in results["horizons"]) + " |",
             "|---|" + "---:|" * len(results["horizons"])]
    for label, values in results["rows"].items():
        lines.append(f"| {label} | " + " | ".join(error_cell(v) for v in np.mean(values, 0)) + " |")
    if "sequences_per_horizon" in results:  # a json saved before they were recorded has none
        lines += ["", f"Sequences averaged over per horizon (of {HELD_OUT_ENVS}; one whose episode restarts within "
                  "the first h predicted steps is left out; a horizon with none left shows — above):", ""]
        lines += [f"- {label}: " + ", ".join(f"h={h}: {c}" for h, c in zip(results["horizons"], counts))
                  for label, counts in results["sequences_per_horizon"].items()]
    lines += ["", "Reward error (mean over seeds; where each agent measures it):", ""]
    lines += [f"- {label}: {np.mean(values):.4g}" for label, values in results["reward_error"].items()]
    return "\n".join(lines) + "\n"


def error_cell(value: float) -> str:
    """A table cell: the error, or — where no sequence was left to measure it on (NaN)."""
    return f"{value:.4f}" if np.isfinite(value) else "—"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, values in results["rows"].items():
        axis = axes[0] if label.startswith("CartPole") else axes[1]
        style = "--" if "copy" in label else "-"
        axis.plot(results["horizons"], np.mean(values, 0), style, marker="o", label=label.split(": ", 1)[1])
    for axis, title in zip(axes, ("CartPole-v1", "maze (64 training levels)")):
        axis.set(title=title, xlabel="steps predicted open-loop", ylabel="MSE per observation feature", yscale="log")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def reproduce(out: Path, quick: bool, skip_training: bool) -> Path:
    """Measure (``skip_training``: re-render the saved json) and write ``model_error{_quick}.md/.json/.png``."""
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if quick else ""
    saved, path = out / f"model_error{suffix}.json", out / f"model_error{suffix}.md"
    results = read_saved(saved, __name__, quick) if skip_training else measure(quick)
    save_json(saved, results)
    path.write_text(markdown(results))
    plot(results, out / f"model_error{suffix}.png")
    print(path.read_text())
    return path
