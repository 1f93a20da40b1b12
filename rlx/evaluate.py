"""``python -m rlx.evaluate run_dir=DIR [episodes=N] [greedy=true] [seed=0] [render=true] [gymnasium=true]``.

Reloads a run's config and latest checkpoint, runs fresh evaluation episodes
for every seed (and sweep point), prints return mean ± std per seed and writes
``evaluation.json`` into DIR. ``render=true`` also writes ``episode.gif``: one
greedy episode of seed 0 (of the best sweep point), for the single-agent environments
gymnax can draw (classic control, MinAtar, bsuite Catch). ``gymnasium=true``
(or ``gymnasium=ENV_ID``) also plays seed 0's policy in the matching
Gymnasium environment through ``rlx.export.GymnasiumPolicy``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rlx.cli_args import parse_key_values
from rlx.errors import ConfigError, InputError

OPTIONS = {"run_dir": None, "episodes": "16", "greedy": "true", "seed": "0", "render": "false", "render_steps": "200",
           "gymnasium": None}


def parse(argv: list[str]) -> dict:
    """key=value arguments, checked: unknown keys and bad values name the valid choices."""
    values = parse_key_values(argv, OPTIONS, "python -m rlx.evaluate run_dir=DIR [episodes=N] [greedy=true]",
                              integers=("episodes", "seed", "render_steps"), booleans=("greedy", "render"))
    if values["episodes"] < 1:
        raise ConfigError(f"episodes={values['episodes']}: must be >= 1")
    if values["gymnasium"] is not None and values["gymnasium"].lower() == "false":
        values["gymnasium"] = None  # a Gymnasium id otherwise: true, or the id of the environment to play
    values["run_dir"] = Path(values["run_dir"])
    return values


def evaluate_run(run_dir: Path, episodes: int, greedy: bool, seed: int) -> dict:
    """Evaluation returns of every grid point and seed of a trained run, as a JSON-ready dict."""
    import jax

    from rlx.runner import components

    run = components.load_trained(run_dir, eval_episodes=episodes, eval_greedy=greedy)
    keys = jax.random.split(jax.random.PRNGKey(seed), run.parts.settings.num_seeds)
    returns, outcomes = run.programs.evaluation(run.state, keys)  # each [point, seed, episode]
    grid = run.parts.grid
    points = []
    for index in range(grid.size):
        per_seed = [{"mean": float(r.mean()), "std": float(r.std())} for r in returns[index]]
        point = {"point": grid.points[index], "per_seed": per_seed,
                 "mean_over_seeds": float(returns[index].mean(axis=1).mean()),
                 "std_over_seeds": float(returns[index].mean(axis=1).std())}
        for name, values in outcomes.items():  # e.g. SMAX's win rate, "won_mean_over_seeds"
            for seed_figures, share in zip(per_seed, values[index].mean(axis=1)):
                seed_figures[name] = float(share)
            point[f"{name}_mean_over_seeds"] = float(values[index].mean())
        points.append(point)
    best = max(range(grid.size), key=lambda i: points[i]["mean_over_seeds"])
    return {"run_dir": str(run_dir), "env": run.parts.env_name, "updates": run.progress["updates_done"],
            "episodes_per_seed": episodes, "greedy": greedy, "seed": seed, "points": points, "best_point": best,
            "_run": run}


# What gymnax's ``Visualizer`` draws (it picks a drawer by ``env.name`` and draws nothing for other names).
DRAWABLE = ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Catch-bsuite",
            "Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar", "SpaceInvaders-MinAtar",
            "Pong-misc", "PointRobot-misc", "MetaMaze-misc", "FourRooms-misc")


def check_drawable(env, env_name: str) -> None:
    """``ConfigError`` unless gymnax can draw ``env``: before any episode is played, instead of a blank GIF
    (an environment gymnax has no drawer for) or a traceback (one array of rewards per agent)."""
    from rlx.runner.evaluation import is_multi_agent

    if is_multi_agent(env):
        raise ConfigError(f"render=true: {env_name} is a multi-agent environment; gymnax draws single-agent ones only")
    if getattr(env, "name", None) not in DRAWABLE:
        raise ConfigError(f"render=true: gymnax cannot draw {env_name}; it draws {', '.join(DRAWABLE)}")


def render_episode(run, point: int, path: Path, max_steps: int, seed: int) -> int:
    """Write a GIF of one greedy episode of seed 0 at ``point``; returns its length."""
    import jax
    import numpy as np

    from rlx.runner.evaluation import stateful_act

    import os

    check_drawable(run.parts.env, run.parts.env_name)

    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame draws classic control; no sound card needed
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    try:
        from gymnax.visualize import Visualizer
    except ImportError as error:
        raise ConfigError(f"render=true: gymnax's visualizer is unavailable ({error})") from None
    env, env_params = run.parts.env, run.parts.env_params
    batch_act, init_memory = stateful_act(run.agent(point))
    policy = run.policy(point, 0)
    act = jax.jit(lambda memory, obs, reset, key: batch_act(policy, memory, obs[None], reset[None], key, True))
    step = jax.jit(lambda key, state, action: env.step(key, state, action, env_params))
    key = jax.random.PRNGKey(seed)
    obs, state = env.reset(key, env_params)
    memory, reset, states, rewards = init_memory(1), np.array(True), [state], []
    for t in range(max_steps):
        key, act_key, step_key = jax.random.split(key, 3)
        memory, action = act(memory, obs, reset, act_key)
        obs, next_state, reward, terminated, truncated, _ = step(step_key, state, action[0])
        rewards.append(float(reward))
        if bool(terminated) or bool(truncated):
            break
        state, reset = next_state, np.array(False)
        states.append(state)
    try:
        Visualizer(env, env_params, states, np.concatenate([[0.0], np.cumsum(rewards)])[: len(states)]).animate(str(path))
    except (KeyError, AttributeError, ValueError) as error:
        raise ConfigError(f"render=true: {run.parts.env_name} cannot be drawn by gymnax ({error})") from None
    return len(states)


def main(argv: list[str] | None = None) -> None:
    from rlx.runner import compile_cache

    compile_cache.set_xla_flags()
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
        result = evaluate_run(options["run_dir"], options["episodes"], options["greedy"], options["seed"])
        run = result.pop("_run")
        for point in result["points"]:
            label = ", ".join(f"{k}={v:g}" for k, v in point["point"].items())
            print(f"{result['env']} {label}".strip() + f": {point['mean_over_seeds']:.1f} ± "
                  f"{point['std_over_seeds']:.1f} over seeds")
            for seed, figures in enumerate(point["per_seed"]):
                outcomes = "".join(f", {name} {share:.0%}" for name, share in figures.items() if name not in ("mean", "std"))
                print(f"  seed {seed}: {figures['mean']:.1f} ± {figures['std']:.1f}{outcomes} over {options['episodes']} episodes")
        out = options["run_dir"] / "evaluation.json"
        out.write_text(json.dumps(result, indent=2) + "\n")  # kept should the Gymnasium play below fail
        if options["gymnasium"]:
            from rlx.export import GymnasiumPolicy, gymnasium_returns

            env_id = None if options["gymnasium"].lower() == "true" else options["gymnasium"]
            policy = GymnasiumPolicy(options["run_dir"], point=result["best_point"], greedy=options["greedy"])
            returns = gymnasium_returns(policy, env_id, options["episodes"], options["seed"])
            result["gymnasium"] = {"env_id": env_id or result["env"], "seed": 0, "returns": returns.tolist(),
                                   "mean": float(returns.mean()), "std": float(returns.std())}
            print(f"Gymnasium {env_id or result['env']} (seed 0): {returns.mean():.1f} ± {returns.std():.1f} "
                  f"over {options['episodes']} episodes")
            out.write_text(json.dumps(result, indent=2) + "\n")  # now with the Gymnasium figures
        if options["render"]:
            gif = options["run_dir"] / "episode.gif"
            length = render_episode(run, result["best_point"], gif, options["render_steps"], options["seed"])
            print(f"wrote {gif} ({length} frames)")
        print(f"wrote {out}", file=sys.stderr)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
