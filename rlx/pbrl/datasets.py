"""Offline preference datasets made by rlx: segments of PPO policies at several skill levels, oracle-labelled pairs.

``make_datasets(env, levels, cache_dir)`` trains one PPO run (``rlx/agents/ppo.py`` with the
settings of ``conf/exp/ppo_<env>.yaml``; Acrobot's and Pendulum's budgets halved, which still
ends near their presets' returns) on a gymnax environment, keeps the policy after every update, rolls out some of them with *sampled* actions, cuts the rollouts into segments, draws
random pairs of segments and labels them with a scripted oracle teacher. One ``.npz`` file per
level, cached under ``cache_dir`` (a file is reused when its settings match).

Levels (returns are those of the sampled-action policy, measured on fresh episodes):

* ``random`` -- the untrained policy (PPO's initial network: near-uniform actions);
* ``medium`` -- the policy after the update whose return is closest to halfway between the
  random and the expert return (for CartPole about 260 of 500);
* ``expert`` -- the policy at the end of the run;
* ``replay`` -- equal shares of segments from policies spread evenly over the run, the random,
  medium and expert ones included (a replay buffer of the run).

Environments (``ENVS``): ``cartpole`` (CartPole-v1), ``acrobot`` (Acrobot-v1), ``pendulum``
(Pendulum-v1). CartPole pays 1 per step whether the pole falls or not, so the oracle subtracts
``terminal_penalty`` (default 1) from the reward of every terminating step; elsewhere it is 0.

File format (``np.savez``; bring your own data in the same layout; ``S`` segments of ``L``
steps, ``P`` pairs)::

    obs        float32 [S, L, *obs_shape]  observation before each action
    actions    int32 [S, L] (discrete) or float32 [S, L, action_dim] (continuous, env units)
    rewards    float32 [S, L]              true environment reward of each step
    pairs      int32 [P, 2]                indices of the two segments of each pair
    labels     float32 [P]                 probability that the second segment is preferred:
                                           0 (first), 1 (second), 0.5 (tie), or in between
    mask       float32 [P]                 1: use the pair; 0: skipped (no preference given)
    env        str (0-d)                   environment name in ``rlx.envs.registry``
    level      str (0-d)                   how the data was made (free text for your own data)

optional (written by rlx, defaults when absent):

    terminals         float32 [S, L]  1 where the step terminated the episode (default 0)
    terminal_penalty  float (0-d)     subtracted per terminating step by the oracle (default 0)
    source            int32 [S]       index of the policy that made each segment
    source_updates    int32 [K]       PPO updates of each such policy (0: untrained)
    source_returns    float32 [K]     its mean return (sampled actions)
    settings          str (0-d)       JSON of the generation settings (the cache key)

A segment's steps are consecutive steps of one environment; they may run across an episode
boundary (the environment auto-resets). ``load_dataset(path)`` checks all of this and raises
``DatasetError`` naming the file and the field; ``to_agent_data`` turns a dataset into the
arrays ``rlx/agents/cpl.py`` trains on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import zipfile
from pathlib import Path

import numpy as np

from rlx.errors import InputError

LEVELS = ("random", "medium", "expert", "replay")
REQUIRED = ("obs", "actions", "rewards", "pairs", "labels", "mask", "env", "level")


class DatasetError(InputError):
    """A malformed dataset file: the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class EnvPreset:
    """How to make one environment's datasets: PPO settings and the segment and pair counts."""

    env_name: str
    ppo: dict  # ppo.Config fields (the conf/exp/ppo_<env>.yaml preset)
    expert_min_return: float  # a run whose final policy is worse is retried with another seed
    segment_length: int = 25
    terminal_penalty: float = 0.0
    quick_timesteps: int = 0  # PPO budget of quick mode


ENVS = {
    "cartpole": EnvPreset(
        "CartPole-v1",
        dict(total_timesteps=100_000, num_envs=8, num_steps=64, lr=2.5e-3, ent_coef=0.0, gamma=0.98, gae_lambda=0.9),
        expert_min_return=400.0, terminal_penalty=1.0, quick_timesteps=40_960,
    ),
    "acrobot": EnvPreset(
        "Acrobot-v1",
        dict(total_timesteps=245_760, num_envs=16, num_steps=128, lr=1e-3, ent_coef=0.0, gae_lambda=0.94,
             normalize_observations=True),
        expert_min_return=-150.0, quick_timesteps=81_920,
    ),
    "pendulum": EnvPreset(
        "Pendulum-v1",
        dict(total_timesteps=163_840, num_envs=16, num_steps=128, num_epochs=10, num_minibatches=16, lr=1e-3,
             ent_coef=0.0, gamma=0.95, gae_lambda=0.95, normalize_observations=True, normalize_rewards=True),
        expert_min_return=-400.0, quick_timesteps=65_536,
    ),
}


# Raised whenever the way datasets are generated changes, so that files cached by older code are not reused.
GENERATOR_VERSION = 2  # 2: each source policy and level draws on randomness of its own (2026-12-06)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What decides a dataset's content besides the environment's ``EnvPreset`` (PPO settings, expert
    threshold) and ``GENERATOR_VERSION``: all three are hashed into the cache file name."""

    env: str
    seed: int = 0
    num_segments: int = 1000
    num_pairs: int = 2000
    segment_length: int = 25
    terminal_penalty: float = 0.0
    ppo_timesteps: int = 0
    replay_policies: int = 8
    collect_envs: int = 16
    eval_episodes: int = 16

    def key(self) -> str:
        preset = dataclasses.asdict(ENVS[self.env]) if self.env in ENVS else None
        text = json.dumps({**dataclasses.asdict(self), "preset": preset, "generator": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:10]


def default_settings(env: str, quick: bool = False, seed: int = 0, **overrides) -> Settings:
    if env not in ENVS:
        from rlx.errors import UnknownNameError

        raise UnknownNameError("dataset env", env, sorted(ENVS))
    preset = ENVS[env]
    values = dict(env=env, seed=seed, segment_length=preset.segment_length, terminal_penalty=preset.terminal_penalty,
                  ppo_timesteps=preset.quick_timesteps if quick else preset.ppo["total_timesteps"])
    if quick:
        values.update(num_segments=200, num_pairs=500, replay_policies=4, eval_episodes=8)
    values.update(overrides)
    return Settings(**values)


def dataset_path(cache_dir, settings: Settings, level: str) -> Path:
    return Path(cache_dir) / f"{settings.env}_{level}_seed{settings.seed}_{settings.key()}.npz"


# --------------------------------------------------------------------------- labels


def oracle_labels(rewards, terminals, pairs, terminal_penalty: float = 0.0) -> np.ndarray:
    """P(second segment preferred) by summed reward (minus ``terminal_penalty`` per termination): 0, 0.5 or 1."""
    returns = np.asarray(rewards, np.float64).sum(-1) - terminal_penalty * np.asarray(terminals, np.float64).sum(-1)
    r0, r1 = returns[pairs[:, 0]], returns[pairs[:, 1]]
    return np.where(r1 > r0, 1.0, np.where(r1 < r0, 0.0, 0.5)).astype(np.float32)


def random_pairs(rng: np.random.Generator, num_segments: int, num_pairs: int) -> np.ndarray:
    """``[num_pairs, 2]`` uniformly random pairs of two different segments."""
    first = rng.integers(0, num_segments, num_pairs)
    second = (first + rng.integers(1, num_segments, num_pairs)) % num_segments
    return np.stack([first, second], -1).astype(np.int32)


# --------------------------------------------------------------------------- generation


def train_ppo_policies(env, env_params, preset: EnvPreset, settings: Settings):
    """One PPO run; ``(agent, policies, returns)`` with the policy before the first and after every update.

    ``policies`` is the stacked ``ppo.Policy`` pytree ``[num_updates + 1, ...]``; ``returns [num_updates + 1]``
    the mean return of each with sampled actions over ``settings.eval_episodes`` episodes.
    """
    import jax
    import jax.numpy as jnp

    from rlx.agents import ppo
    from rlx.runner.evaluation import evaluate

    config = ppo.Config(**{**preset.ppo, "total_timesteps": settings.ppo_timesteps})
    ppo.validate(config)
    agent = ppo.make(config, env, env_params)

    @jax.jit
    def run(key):
        train_key, eval_key = jax.random.split(key)
        state = agent.init(train_key)

        def step(state, _):
            state, _ = agent.update(state)
            return state, state.policy

        _, policies = jax.lax.scan(step, state, None, config.num_updates)
        policies = jax.tree.map(lambda first, rest: jnp.concatenate([first[None], rest]), state.policy, policies)
        returns = jax.vmap(lambda policy: evaluate(agent, env, env_params, policy, eval_key,
                                                   settings.eval_episodes, False).mean())(policies)
        return policies, returns

    for attempt in range(3):
        policies, returns = run(jax.random.fold_in(jax.random.PRNGKey(settings.seed), attempt))
        returns = np.asarray(returns)
        if returns[-1] >= preset.expert_min_return or settings.ppo_timesteps < preset.ppo["total_timesteps"]:
            break  # quick budgets may fall short; their data mean little anyway
        print(f"[datasets] {settings.env}: PPO run {attempt} ended at return {returns[-1]:.1f} "
              f"< {preset.expert_min_return}; retrying with another seed", flush=True)
    else:
        raise RuntimeError(f"{settings.env}: 3 PPO runs ended below the expert return {preset.expert_min_return}")
    return agent, policies, returns


def collect_segments(agent, env, env_params, policies, keys, num_envs: int, segments_per_policy: int, length: int):
    """Roll out each of the stacked ``policies`` (sampled actions, ``keys[i]`` for policy ``i``) and cut the
    rollouts into segments.

    Returns numpy arrays ``obs, actions, rewards, terminals`` shaped ``[K, segments_per_policy, L, ...]``.
    """
    import jax
    import jax.numpy as jnp

    per_env = -(-segments_per_policy // num_envs)
    steps = per_env * length

    def rollout(policy, key):
        reset_key, key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs), env_params)

        def step(carry, key):
            obs, state = carry
            act_key, step_key = jax.random.split(key)
            action = agent.act(policy, obs, act_key, False)
            next_obs, state, reward, terminated, _, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, env_params
            )
            return (next_obs, state), (obs, action, reward.astype(jnp.float32), terminated.astype(jnp.float32))

        _, traj = jax.lax.scan(step, (obs, state), jax.random.split(key, steps))

        def cut(x):  # [T, N, ...] -> [N * T / L, L, ...], then the first segments_per_policy
            x = jnp.moveaxis(x, 1, 0).reshape((num_envs * per_env, length) + x.shape[2:])
            return x[:segments_per_policy]

        return jax.tree.map(cut, traj)

    # One policy at a time, not vmapped: a policy's rollout is then the same computation, to the bit,
    # whichever policies share the call.
    run = jax.jit(rollout)
    outs = [run(jax.tree.map(lambda x: x[i], policies), keys[i]) for i in range(len(keys))]
    return tuple(np.stack([np.asarray(out[field]) for out in outs]) for field in range(4))


def make_datasets(env: str, levels=LEVELS, cache_dir="datasets", quick: bool = False, seed: int = 0,
                  **overrides) -> dict[str, Path]:
    """Make (or reuse from ``cache_dir``) the datasets of ``levels`` for ``env``; returns level -> file path.

    ``overrides`` replace fields of ``Settings`` (``num_segments``, ``num_pairs``, ``segment_length``, ...).
    """
    import jax

    from rlx.envs import registry

    settings = default_settings(env, quick, seed, **overrides)
    unknown = [level for level in levels if level not in LEVELS]
    if unknown:
        from rlx.errors import UnknownNameError

        raise UnknownNameError("dataset level", unknown[0], LEVELS)
    paths = {level: dataset_path(cache_dir, settings, level) for level in levels}
    missing = [level for level, path in paths.items() if not path.is_file()]
    if not missing:
        return paths
    started = time.time()
    preset = ENVS[env]
    env_obj, env_params = registry.make(preset.env_name)
    agent, policies, returns = train_ppo_policies(env_obj, env_params, preset, settings)
    last = len(returns) - 1
    target = returns[0] + 0.5 * (returns[-1] - returns[0])
    medium = int(np.argmin(np.abs(returns[1:last] - target))) + 1 if last > 1 else last
    level_sources = {"random": [0], "medium": [medium], "expert": [last]}
    spread = np.linspace(0, last, settings.replay_policies).round().astype(int)
    level_sources["replay"] = sorted(set(spread.tolist()) | {0, medium, last})
    chosen = sorted({i for level in missing for i in level_sources[level]})
    picked = jax.tree.map(lambda x: x[np.asarray(chosen)], policies)
    # Each policy's segments and each level's picks draw on randomness of their own, so a level's file holds
    # the same data whichever other levels were made with it (its name promises as much).
    collect_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.PRNGKey(settings.seed + 1),
                                                                    np.asarray(chosen))
    obs, actions, rewards, terminals = collect_segments(
        agent, env_obj, env_params, picked, collect_keys, settings.collect_envs, settings.num_segments,
        settings.segment_length,
    )
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    for level in missing:
        rng = np.random.default_rng([settings.seed, LEVELS.index(level)])
        rows = [chosen.index(i) for i in level_sources[level]]
        if len(rows) == 1:
            take = [(rows[0], j) for j in range(settings.num_segments)]
        else:  # equal shares of randomly chosen segments from every source policy
            shares = np.array_split(np.arange(settings.num_segments), len(rows))
            take = [(row, j) for row, share in zip(rows, shares)
                    for j in rng.choice(settings.num_segments, len(share), replace=False)]
        k, j = map(np.asarray, zip(*take))
        source_ids = np.asarray(level_sources[level])
        pairs = random_pairs(rng, settings.num_segments, settings.num_pairs)
        arrays = dict(
            obs=obs[k, j].astype(np.float32), actions=actions[k, j], rewards=rewards[k, j],
            terminals=terminals[k, j], pairs=pairs,
            labels=oracle_labels(rewards[k, j], terminals[k, j], pairs, settings.terminal_penalty),
            mask=np.ones(settings.num_pairs, np.float32), env=np.array(preset.env_name), level=np.array(level),
            terminal_penalty=np.float32(settings.terminal_penalty),
            source=np.searchsorted(source_ids, np.asarray(chosen)[k]).astype(np.int32),
            source_updates=source_ids.astype(np.int32), source_returns=returns[source_ids].astype(np.float32),
            settings=np.array(json.dumps(dataclasses.asdict(settings), sort_keys=True)),
        )
        arrays["actions"] = arrays["actions"].astype(np.int32 if np.issubdtype(actions.dtype, np.integer) else np.float32)
        save_dataset(paths[level], arrays)
    print(f"[datasets] {env}: made {', '.join(missing)} in {time.time() - started:.1f}s "
          f"(returns: random {returns[0]:.1f}, medium {returns[medium]:.1f} after {medium} updates, "
          f"expert {returns[-1]:.1f})", flush=True)
    return paths


def save_dataset(path, arrays: dict) -> Path:
    """Check ``arrays`` against the format and write them to ``path`` (``.npz``), atomically."""
    path = Path(path)
    validate(arrays, str(path))
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- loading and checking


def load_dataset(path) -> dict:
    """Read and check a dataset file; ``DatasetError("<file>: <field>: ...")`` on the first problem.

    Returns a dict of numpy arrays with ``env`` and ``level`` as ``str`` and the optional
    fields filled with their defaults.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such dataset file")
    try:
        with np.load(path, allow_pickle=False) as stored:
            arrays = {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise DatasetError(f"{path}: cannot read as .npz ({error})") from None
    return validate(arrays, str(path))


def validate(arrays: dict, source: str = "dataset") -> dict:
    """Check a dataset's arrays (see the module docstring); returns them with defaults filled in."""

    def fail(field, message):
        raise DatasetError(f"{source}: field '{field}': {message}")

    missing = [name for name in REQUIRED if name not in arrays]
    if missing:
        fail(missing[0], f"missing (a dataset needs {', '.join(REQUIRED)})")
    out = dict(arrays)
    for name in ("env", "level"):
        value = np.asarray(arrays[name])
        if value.ndim != 0 or value.dtype.kind not in "US":
            fail(name, f"must be a string, got {value.dtype} of shape {value.shape}")
        try:  # bytes (as h5py and NumPy's "S" strings give) would read as "np.bytes_(b'...')"
            out[name] = value.item().decode("utf-8") if value.dtype.kind == "S" else str(value)
        except UnicodeDecodeError:
            fail(name, "bytes that are not UTF-8 text")
    obs = np.asarray(arrays["obs"])
    if obs.ndim < 2 or obs.shape[0] < 1 or obs.shape[1] < 1:
        fail("obs", f"shape {obs.shape}, expected [segments, length, *obs_shape]")
    num_segments, length = obs.shape[:2]
    for name in ("obs", "rewards", "labels", "mask", "actions", "terminals", "terminal_penalty"):
        if name not in arrays:  # only the optional ones can be missing here
            continue
        value = np.asarray(arrays[name])
        if value.dtype.kind not in "biuf":
            fail(name, f"must be numeric, got dtype {value.dtype}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            fail(name, "contains NaN or infinite values")
    actions = np.asarray(arrays["actions"])
    if actions.shape[:2] != (num_segments, length) or actions.ndim not in (2, 3):
        fail("actions", f"shape {actions.shape}, expected [{num_segments}, {length}] (discrete) "
                        f"or [{num_segments}, {length}, action_dim] (continuous)")
    if actions.ndim == 2 and actions.dtype.kind == "f":
        fail("actions", f"discrete actions [S, L] must be integers, got {actions.dtype}")
    shapes = {"rewards": (num_segments, length), "terminals": (num_segments, length)}
    for name, shape in shapes.items():
        if name in arrays and np.shape(arrays[name]) != shape:
            fail(name, f"shape {np.shape(arrays[name])}, expected {list(shape)}")
    pairs = np.asarray(arrays["pairs"])
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.shape[0] < 1 or pairs.dtype.kind not in "iu":
        fail("pairs", f"shape {pairs.shape} dtype {pairs.dtype}, expected integers [pairs >= 1, 2]")
    if pairs.min() < 0 or pairs.max() >= num_segments:
        fail("pairs", f"segment indices must be in [0, {num_segments}), found {pairs.min()}..{pairs.max()}")
    if (pairs[:, 0] == pairs[:, 1]).any():
        fail("pairs", f"pair {int(np.argmax(pairs[:, 0] == pairs[:, 1]))} compares a segment with itself")
    if "terminals" in arrays and not np.isin(np.asarray(arrays["terminals"]), (0, 1)).all():
        fail("terminals", "must be 0 or 1 (1 where a step terminated its episode)")
    num_pairs = pairs.shape[0]
    for name in ("labels", "mask"):
        if np.shape(arrays[name]) != (num_pairs,):
            fail(name, f"shape {np.shape(arrays[name])}, expected [{num_pairs}] (one per pair)")
    labels, mask = np.asarray(arrays["labels"], np.float64), np.asarray(arrays["mask"], np.float64)
    if ((labels < 0) | (labels > 1)).any():
        fail("labels", f"must be probabilities in [0, 1], found {labels.min()}..{labels.max()}")
    if not np.isin(mask, (0.0, 1.0)).all():
        fail("mask", "must be 0 or 1")
    if "source" in arrays:
        origin = np.asarray(arrays["source"])  # not `source`: the file
        if origin.shape != (num_segments,):
            fail("source", f"shape {origin.shape}, expected [{num_segments}]")
        if origin.dtype.kind not in "iu" or origin.min() < 0:
            fail("source", f"must be indices >= 0 into source_updates / source_returns, got {origin.dtype} "
                           f"from {origin.min()}")
        for name in ("source_updates", "source_returns"):
            if name in arrays and (np.ndim(arrays[name]) != 1 or origin.max() >= len(arrays[name])):
                fail(name, f"shape {np.shape(arrays[name])}: needs one entry per source index (max {origin.max()})")
    out["obs"] = obs.astype(np.float32)
    out["actions"] = actions.astype(np.int32 if actions.ndim == 2 else np.float32)
    out["rewards"] = np.asarray(arrays["rewards"], np.float32)
    out["pairs"] = pairs.astype(np.int32)
    out["labels"] = labels.astype(np.float32)
    out["mask"] = mask.astype(np.float32)
    out["terminals"] = np.asarray(arrays.get("terminals", np.zeros((num_segments, length))), np.float32)
    if np.ndim(arrays.get("terminal_penalty", 0.0)) != 0:
        fail("terminal_penalty", f"shape {np.shape(arrays['terminal_penalty'])}, expected a single number")
    out["terminal_penalty"] = float(arrays.get("terminal_penalty", 0.0))
    return out


def to_agent_data(dataset: dict):
    """The ``rlx.agents.cpl.Data`` arrays of a loaded dataset."""
    from rlx.agents import cpl

    return cpl.Data(dataset["obs"], dataset["actions"], dataset["pairs"], dataset["labels"], dataset["mask"])


def summary(dataset: dict) -> dict:
    """A few numbers that describe a dataset: sizes, segment returns as the oracle sees them, label balance."""
    returns = dataset["rewards"].sum(-1) - dataset["terminal_penalty"] * dataset["terminals"].sum(-1)
    labels, mask = dataset["labels"], dataset["mask"]
    return {
        "env": dataset["env"], "level": dataset["level"], "segments": int(returns.shape[0]),
        "segment_length": int(dataset["rewards"].shape[1]), "pairs": int(labels.shape[0]),
        "teacher_return_mean": float(returns.mean()), "teacher_return_std": float(returns.std()),
        "terminations_per_segment": float(dataset["terminals"].sum(-1).mean()),
        "ties": float(((labels == 0.5) & (mask > 0)).mean()), "skipped": float((mask == 0).mean()),
        "policy_returns": [float(r) for r in dataset.get("source_returns", [])],
    }
