"""Generalization with dreams: ``python -m rlx.reproduce imagination_generalization [--quick] [--skip-training]``.

On the procedurally generated, sparsely rewarded maze (``rlx/envs/maze.py``, 9x9, reward ``1 - 0.9 t/64``
on reaching the goal), for each number of training levels N in {16, 64, 256} and each seed:

1. a uniformly random policy collects ``REAL_STEPS`` real steps on the N training levels (level ids
   ``[0, N)``) -- the only real experience the imagination methods get;
2. on exactly that data, ``rlx/agents/dreamer.py`` trains its world model and an actor-critic for
   ``GRAD_STEPS`` gradient steps in three ways: **dream-augmented imagination** (``DREAMS``: noise,
   interpolation between episodes' states and a steady push toward unseen states, all at once),
   **classic imagination** (no augmentation) and **offline** actor-critic on the collected sequences
   themselves (``actor_source=replay``: same networks and losses, no imagination);
3. model-free PPO (``rlx/agents/ppo.py``) trains online for the same number of real steps on the same
   N levels;
4. every policy plays ``EVAL_EPISODES`` episodes (sampled actions: a deterministic policy without a clock
   can loop forever in a maze) on the training levels and on unseen levels (ids from 1,000,000 on).

The table reports train-level and test-level returns (mean over seeds with a 95% Student-t interval
over seeds) beside the random policy's and the optimal policy's (shortest path) returns, and the
generalization gap. Writes ``experiments/imagination/generalization.md`` and ``.json``.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np

from rlx.imagination import measured_on, read_saved, save_json, seed_count, today

EXPERIMENT_DIR = "imagination"
LEVEL_COUNTS = (16, 64, 256)
TEST_OFFSET = 1_000_000  # unseen levels: ids from here on, never drawn in training
REAL_STEPS = 16_384  # real env steps of experience per seed (32 envs x 512 steps)
COLLECT_ENVS = 32
GRAD_STEPS = 3_000  # world-model and actor-critic gradient steps on the collected data
EVAL_EPISODES = 256
EVAL_STEPS = 64  # the maze's max_steps_in_episode (the level sets are traced, so it is passed explicitly)
SEEDS = 3  # about an hour per N on one core (2026-12-03); more seeds narrow the intervals (--seeds N overrides it)
DREAMS = dict(dream_noise=0.5, dream_interpolation=0.5, dream_perturbation=0.25)
METHODS = {  # row label -> dreamer settings
    "dream-augmented imagination": DREAMS,
    "classic imagination": {},
    "offline actor-critic on the collected data (no imagination)": dict(actor_source="replay"),
}
PPO_ROW = "model-free PPO, same real steps (online)"
# Dreamer settings for the 9x9x3 maze: the spatial (convolutional) RSSM, 16 deterministic channels and one
# 8-class categorical per cell. The reconstruction weighs 10x: the moving agent is one cell of 81, and at the
# default weight the posterior stops encoding it (KL is cheaper than its squared error). Imagination runs from
# 64 of the batch's 256 posterior states, a quarter of the compute. Imagination runs 5 steps, not 15: over 15
# the actor found imagined paths to the goal that the real maze does not have (seeds 1 and 2 of N=64: real
# train-level returns 0.124 / 0.119 at 15 steps, 0.321 / 0.177 at 5), and the critic bootstraps the rest.
SPATIAL_MODEL = dict(world_model="conv", deter_size=16, num_latents=1, num_classes=8, recon_coef=10.0,
                     imagine_starts=64)
DREAMER = dict(num_envs=COLLECT_ENVS, num_steps=16, capacity_steps=REAL_STEPS // COLLECT_ENVS, batch_size=8,
               seq_len=32, horizon=5, gamma=0.97, ent_coef=3e-3, train_ratio=1 / 512, **SPATIAL_MODEL)
PPO = dict(num_envs=16, num_steps=64, num_epochs=4, num_minibatches=4, lr=5e-4, ent_coef=0.01, gamma=0.97,
           hidden_sizes=(64, 64))


def level_params(env, num_levels: int, offset: int = 0):
    """The maze's parameters for a level set: ids ``[offset, offset + num_levels)`` (0: unlimited)."""
    return env.default_params.replace(num_levels=num_levels, level_offset=offset)


def dreamer_rows(env, num_levels: int, seeds: int, grad_steps: int, real_steps: int) -> dict:
    """Train-level and test-level returns per seed ``{label: (train [seeds], test [seeds])}`` of each method."""
    import jax

    from rlx.agents import dreamer

    train_params, test_params = level_params(env, num_levels), level_params(env, 0, TEST_OFFSET)
    program = dreamer_program(env, grad_steps, real_steps)
    keys = jax.random.split(jax.random.PRNGKey(num_levels), seeds)  # the same keys, so the same data, per method
    rows = {}
    for label, settings in METHODS.items():
        config = dreamer.Config(**DREAMER).replace(**settings)
        dreamer.validate(config)
        started = time.time()
        train, test = program(config, train_params, test_params, keys)
        rows[label] = (np.asarray(train, np.float64), np.asarray(test, np.float64))
        print(f"N={num_levels} {label}: train {rows[label][0].mean():.3f}, test {rows[label][1].mean():.3f} "
              f"({time.time() - started:.0f} s)", flush=True)
    return rows


@functools.lru_cache
def dreamer_program(env, grad_steps: int, real_steps: int):
    """``(config, train_params, test_params, keys) -> (train returns, test returns)`` per key, jitted once.

    The config and the level sets are arguments, not constants, so methods that differ only in numeric
    fields (the dream strengths) and the level counts share one compiled program.
    """
    import jax

    from rlx.agents import dreamer
    from rlx.runner.evaluation import evaluate

    def run(config, train_params, test_params, key):
        agent = dreamer.make(config, env, train_params)
        data_key, init_key, train_key, eval_key = jax.random.split(key, 4)
        state, _, _ = train_on_random_experience(agent, (data_key, init_key, train_key), grad_steps, real_steps)
        policy = state.policy
        on = lambda params, k: evaluate(agent, env, params, policy, k, EVAL_EPISODES, False, EVAL_STEPS).mean()  # noqa: E731
        train_key, test_key = jax.random.split(eval_key)
        return on(train_params, train_key), on(test_params, test_key)

    return jax.jit(jax.vmap(run, in_axes=(None, None, None, 0)))


def train_on_random_experience(agent, keys: tuple, grad_steps: int, real_steps: int):
    """Dreamer trained offline on uniformly random experience, as every dreamer row of the study is.

    Collects ``real_steps`` steps in ``COLLECT_ENVS`` environments, stores them in a fresh state's
    buffer and takes ``grad_steps`` of ``agent.train_step`` on it, with ``keys`` = (collection key,
    initialisation key, training key). Returns the trained state, the
    metrics of every step (``[grad_steps]`` each) and the collected dataset.
    """
    import jax

    data_key, init_key, train_key = keys
    dataset = agent.collect(agent.init(data_key), None, real_steps // COLLECT_ENVS)[1]
    state = agent.fill(agent.init(init_key), dataset)
    learner, metrics = jax.lax.scan(lambda l, k: agent.train_step(l, state.buffer, k), state.learner,
                                    jax.random.split(train_key, grad_steps))
    return state.replace(learner=learner), metrics, dataset


def reference_rows(env, num_levels: int, seeds: int, real_steps: int) -> dict:
    """Model-free PPO (online, ``real_steps``) and the uniformly random policy, same evaluation."""
    import jax

    train_params, test_params = level_params(env, num_levels), level_params(env, 0, TEST_OFFSET)
    keys = jax.random.split(jax.random.PRNGKey(7), seeds)
    ppo_train, ppo_test, random_train, random_test = (
        np.asarray(x, np.float64) for x in reference_program(env, real_steps)(train_params, test_params, keys))
    return {PPO_ROW: (ppo_train, ppo_test), "uniformly random policy": (random_train, random_test)}


@functools.lru_cache
def reference_program(env, real_steps: int):
    """``(train_params, test_params, keys) -> PPO train, PPO test, random train, random test`` returns per key."""
    import jax

    from rlx.agents import ppo
    from rlx.baselines.single_agent import uniform_policy
    from rlx.runner.evaluation import evaluate

    config = ppo.Config(**PPO, total_timesteps=real_steps)
    random_agent = uniform_policy(env, env.default_params)

    def run(train_params, test_params, key):
        agent = ppo.make(config, env, train_params)
        train_key, eval_key = jax.random.split(key)
        state, _ = ppo.train(config, env, train_params, train_key)
        keys = jax.random.split(eval_key, 4)
        return (evaluate(agent, env, train_params, state.policy, keys[0], EVAL_EPISODES, False, EVAL_STEPS).mean(),
                evaluate(agent, env, test_params, state.policy, keys[1], EVAL_EPISODES, False, EVAL_STEPS).mean(),
                evaluate(random_agent, env, train_params, None, keys[2], EVAL_EPISODES, False, EVAL_STEPS).mean(),
                evaluate(random_agent, env, test_params, None, keys[3], EVAL_EPISODES, False, EVAL_STEPS).mean())

    return jax.jit(jax.vmap(run, in_axes=(None, None, 0)))


def optimal_returns(env, num_levels: int) -> tuple[float, float]:
    """Mean shortest-path return of the training levels and of 1,024 unseen levels."""
    import jax

    from rlx.envs import maze

    horizon = int(env.default_params.max_steps_in_episode)

    def optimal(level_id):
        walls, agent_pos, goal_pos = maze.generate_level(level_id, env.size, env.default_params.wall_density)
        return maze.optimal_return(walls, agent_pos, goal_pos, horizon)

    per_level = jax.jit(jax.vmap(optimal))
    return (float(per_level(np.arange(num_levels)).mean()),
            float(per_level(TEST_OFFSET + np.arange(1024)).mean()))


def summarize(train: np.ndarray, test: np.ndarray) -> dict:
    from rlx.report import t_interval

    return {"train": train.tolist(), "test": test.tolist(), "train_mean": float(train.mean()),
            "test_mean": float(test.mean()), "train_ci95": t_interval(train), "test_ci95": t_interval(test)}


def run_settings(quick: bool, seeds: int) -> dict:
    """Everything a run's rows depend on, as its json saves it (so a json round trip leaves it unchanged):
    rows of other N are kept only when these match, and the table's header is rendered from them."""
    settings = {"quick": quick, "seeds": seeds, "real_steps": 2048 if quick else REAL_STEPS,
                "grad_steps": 20 if quick else GRAD_STEPS, "eval_episodes": EVAL_EPISODES, "dreams": DREAMS,
                "methods": METHODS, "dreamer": DREAMER, "ppo": PPO, "minutes": 0.0}
    return json.loads(json.dumps(settings))  # tuples as lists, as a saved json reads back


def markdown(results: dict, settings: dict) -> str:
    """The table of ``results``; its header describes ``settings``, the saved ones the rows were made with."""
    episodes = settings.get("eval_episodes", "an unrecorded number of")  # a json saved before they were kept
    dreams = settings.get("dreams", "not recorded in this json")
    lines = [f"Measured {measured_on(settings.get('measured'))} on this machine's CPU"
             f"{' (--quick: tiny budgets, the numbers mean nothing)' if settings['quick'] else ''}: "
             f"{settings['seeds']} seeds, {settings['real_steps']:,} real steps of uniformly random experience per "
             f"seed, {settings['grad_steps']:,} gradient steps; returns of sampled actions over {episodes} "
             "episodes per seed on the training levels and on unseen levels; mean ± 95% Student-t interval over "
             f"seeds; gap = train - test. Dream strengths: {dreams}. "
             f"{settings['minutes']:.0f} min for the N of the run that wrote last "
             "(each N about an hour on one core).", ""]
    for n, rows in sorted(results.items(), key=lambda item: int(item[0])):  # N ascending, whichever process wrote first
        optimum = rows.get("optimal (shortest path)")
        lines += [f"### N = {n} training levels", "",
                  "| method | train levels | unseen levels | gap | test per seed |", "|---|---:|---:|---:|---|"]
        for label, row in rows.items():
            if row is optimum:
                continue
            lines.append(f"| {label} | {row['train_mean']:.3f} ± {row['train_ci95']:.3f} | "
                         f"{row['test_mean']:.3f} ± {row['test_ci95']:.3f} | "
                         f"{row['train_mean'] - row['test_mean']:+.3f} | "
                         f"{', '.join(f'{v:.2f}' for v in row['test'])} |")
        if optimum:
            lines.append(f"| optimal (shortest path) | {optimum['train']:.3f} | {optimum['test']:.3f} | | |")
        lines.append("")
    return "\n".join(lines)


def comparable(settings: dict) -> dict:
    """What the rows depend on: not how long the run took, nor on which day."""
    return {k: v for k, v in settings.items() if k not in ("minutes", "measured")}


def kept_results(saved: Path, settings: dict) -> dict:
    """The saved rows per N when they were made with ``settings`` (minutes aside); else nothing (also when
    the saved settings lack a key that ``settings`` has: rows of unknown settings are not mixed in)."""
    if not saved.exists():
        return {}
    previous = json.loads(saved.read_text())
    return previous["results"] if comparable(previous["settings"]) == comparable(settings) else {}


def set_aside_unkept(saved: Path, settings: dict, level_counts: tuple[int, ...], log: Callable = print) -> None:
    """Before a run of ``level_counts`` replaces ``saved``: when its rows of other N will not be kept (other
    settings), copy it to ``<name>.<date-time>.json`` and say which N and which settings differ, instead of
    dropping those rows without a word."""
    if not saved.exists():
        return
    previous = json.loads(saved.read_text())
    old, new = comparable(previous.get("settings", {})), comparable(settings)
    dropped = sorted(set(previous.get("results", {})) - {str(n) for n in level_counts}, key=int)
    if old == new or not dropped:
        return
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    kept = saved.with_name(f"{saved.stem}.{time.strftime('%Y%m%d-%H%M%S')}.json")
    shutil.copy2(saved, kept)
    log(f"note: {saved.name}'s rows for N = {', '.join(dropped)} were made with other settings ({', '.join(differ)} "
        f"differ or were not recorded), so this run's table leaves them out; they are kept in {kept}")


def check_level_counts(tasks) -> tuple[int, ...]:
    """``--tasks`` as level counts: each must be one of ``LEVEL_COUNTS`` (None: all of them)."""
    if not tasks:
        return LEVEL_COUNTS
    chosen = []
    for task in tasks:
        if not str(task).isdigit() or int(task) not in LEVEL_COUNTS:
            raise SystemExit(f"--tasks: unknown level count {task!r}; this study runs N in {list(LEVEL_COUNTS)}")
        chosen.append(int(task))
    return tuple(chosen)


def reproduce(out: Path, quick: bool, skip_training: bool, seeds: int | None = None, tasks=None) -> Path:
    """Run every N, or the N in ``tasks`` (``skip_training``: re-render the saved json), and write
    ``generalization{_quick}.md``/``.json``. Rows of other N saved by a run with the same settings stay, also
    those that another process running other N (``--tasks``) saves meanwhile: one process per core and N.
    ``seeds``: ``--seeds`` (None: ``SEEDS``, 2 with ``quick``)."""
    from rlx.envs import registry
    level_counts = check_level_counts(tasks)
    settings = run_settings(quick, seed_count(seeds, quick, SEEDS))
    out.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if quick else ""
    saved, path = out / f"generalization{suffix}.json", out / f"generalization{suffix}.md"
    if skip_training:
        results = read_saved(saved, __name__, quick)
        path.write_text(markdown(results["results"], results["settings"]))
        return path
    set_aside_unkept(saved, settings, level_counts)
    env, _ = registry.make("maze")
    started, mine = time.time(), {}
    for n in level_counts:  # the files are rewritten after each N: a long study keeps what it has
        rows = {**dreamer_rows(env, n, settings["seeds"], settings["grad_steps"], settings["real_steps"]),
                **reference_rows(env, n, settings["seeds"], settings["real_steps"])}
        mine[str(n)] = {label: summarize(*values) for label, values in rows.items()}
        train_opt, test_opt = optimal_returns(env, n)
        mine[str(n)]["optimal (shortest path)"] = {"train": train_opt, "test": test_opt}
        # read the file again just before writing: processes running other N at the same time keep theirs
        results = {**kept_results(saved, settings), **mine}
        results = {key: results[key] for key in sorted(results, key=int)}
        settings["minutes"] = (time.time() - started) / 60
        settings["measured"] = today()
        save_json(saved, {"settings": settings, "results": results})
        path.write_text(markdown(results, settings))
    print(path.read_text())
    return path
