"""The queries file: trajectory segments and the pairs of them a human is asked to compare.

Format: one NumPy ``.npz`` archive (``numpy.savez``, no pickled objects) with these arrays,
where ``S`` is the number of segments, ``L`` the segment length and ``P`` the number of pairs:

- ``segment_ids``: str ``[S]``, unique ids; ``"e3-t128"`` is the segment of env 3 that starts at
  step 128 of the rollout;
- ``obs``: float32 ``[S, L, *obs_shape]``, the observation before each step;
- ``action``: the environment's raw actions, int32 ``[S, L]`` (discrete) or float32 ``[S, L, A]``
  (continuous);
- ``reward``: float32 ``[S, L]``, the environment's true reward, for scripted checks; the labelling
  page never shows it;
- ``pairs``: int32 ``[P, 2]``, (left, right) indices into the segments; a pair's query id (the
  ``query`` of ``rlx/pbrl/labels.py``) is its row index;
- ``env``: 0-d str, the name of the environment in ``rlx.envs.registry``;
- ``absorbing`` (optional; all 0 when absent): float32 ``[S, L]``, 1 on the steps of a segment
  after the episode terminated in it. The labelling page shows those steps as "episode over"
  and the agent scores them with its learned absorbing-state reward.

Segments come from one rollout of ``num_envs`` environments for ``num_steps`` steps (by default
one episode horizon, ``max_steps_in_episode``), cut into non-overlapping pieces along time, env
by env; an episode that terminates inside a segment is reset by the environment, and the rest of
the segment is marked ``absorbing``.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from rlx.errors import InputError

FIELDS = ("segment_ids", "obs", "action", "reward", "pairs", "env")
OPTIONAL_FIELDS = ("absorbing",)


class QueryFileError(InputError):
    """A malformed queries file: the message names the file and the field."""


def make_queries(env_name: str, num_pairs: int, segment_length: int, key_seed: int, num_envs: int = 8,
                 policy=None, num_steps: int | None = None) -> dict:
    """Roll out ``policy(obs, key) -> action`` (default: uniformly random actions) and draw pairs of segments.

    ``num_steps`` (default: the environment's episode horizon) is the rollout length per env; it
    is cut into ``num_steps // segment_length`` segments per env.
    """
    import jax

    from rlx.envs import registry

    env, params = registry.make(env_name)
    num_steps = num_steps or int(getattr(params, "max_steps_in_episode", 0)) or segment_length
    if segment_length < 1 or segment_length > num_steps:
        raise ValueError(f"segment_length={segment_length}: must be in [1, {num_steps}] (the rollout horizon "
                         f"of {env_name})")
    per_env = num_steps // segment_length
    num_segments = num_envs * per_env
    possible = num_segments * (num_segments - 1) // 2
    if not 1 <= num_pairs <= possible:
        raise ValueError(f"num_pairs={num_pairs}: must be in [1, {possible}], the pairs of distinct segments among "
                         f"{num_segments} ({num_envs} envs x {per_env} segments of {segment_length} steps)")
    if policy is None:
        policy = lambda obs, key: env.action_space(params).sample(key)  # noqa: E731
    key = jax.random.PRNGKey(key_seed)
    obs, action, reward, terminated = rollout(env, params, policy, num_envs, per_env * segment_length, key)
    obs, action, reward, terminated = (cut(np.asarray(x), segment_length) for x in (obs, action, reward, terminated))
    if np.issubdtype(action.dtype, np.integer):
        action = action.reshape(action.shape[:2]).astype(np.int32)
    else:
        action = action.reshape(*action.shape[:2], -1).astype(np.float32)
    ids = np.array([f"e{e}-t{c * segment_length}" for e in range(num_envs) for c in range(per_env)])
    return {"segment_ids": ids, "obs": obs.astype(np.float32), "action": action,
            "reward": reward.astype(np.float32), "pairs": draw_pairs(num_segments, num_pairs, key_seed),
            "env": np.array(env_name), "absorbing": after_termination(terminated)}


def after_termination(terminated: np.ndarray) -> np.ndarray:
    """``[S, L]`` float32: 1 on the steps of each segment that follow its first termination."""
    terminated = np.asarray(terminated, np.float32)
    return ((np.cumsum(terminated, axis=1) - terminated) > 0).astype(np.float32)


def rollout(env, params, policy, num_envs: int, num_steps: int, key):
    """``(obs, action, reward, terminated)``, each ``[num_envs, num_steps, ...]``, of one jitted rollout (scan over
    steps, vmap over envs)."""
    import jax

    def run(key):
        reset_key, steps_key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs), params)

        def step(carry, key):
            obs, state = carry
            act_key, step_key = jax.random.split(key)
            action = jax.vmap(policy)(obs, jax.random.split(act_key, num_envs))
            next_obs, next_state, reward, terminated, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, params)
            return (next_obs, next_state), (obs, action, reward, terminated)

        _, batch = jax.lax.scan(step, (obs, state), jax.random.split(steps_key, num_steps))
        return jax.tree.map(lambda x: jax.numpy.swapaxes(x, 0, 1), batch)

    return jax.jit(run)(key)


def cut(x: np.ndarray, segment_length: int) -> np.ndarray:
    """``[E, T, ...]`` -> ``[E * T // segment_length, segment_length, ...]``, env-major."""
    return x.reshape(x.shape[0] * (x.shape[1] // segment_length), segment_length, *x.shape[2:])


def draw_pairs(num_segments: int, num_pairs: int, seed: int) -> np.ndarray:
    """``[num_pairs, 2]`` distinct unordered pairs of distinct segments, each in a random left/right order."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(num_segments * (num_segments - 1) // 2, size=num_pairs, replace=False)
    # Flat index k of the pair i < j, ordered by j: k = j * (j - 1) / 2 + i.
    second = ((1 + np.sqrt(1 + 8 * flat.astype(np.float64))) // 2).astype(np.int64)
    second -= second * (second - 1) // 2 > flat
    second += (second + 1) * second // 2 <= flat
    first = flat - second * (second - 1) // 2
    pairs = np.stack([first, second], axis=1)
    swap = rng.random(num_pairs) < 0.5
    pairs[swap] = pairs[swap, ::-1]
    return pairs.astype(np.int32)


def save_queries(path, queries: dict) -> None:
    """Write ``queries`` (the arrays of ``FIELDS``) to ``path`` as an uncompressed ``.npz``.

    Written to a temporary file first and renamed, so an interrupted save leaves no partial file.
    """
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        np.savez(handle, **{field: np.asarray(queries[field]) for field in FIELDS + OPTIONAL_FIELDS
                            if field in queries})
    os.replace(partial, path)


def load_queries(path) -> dict:
    """The arrays of a queries file, validated; ``QueryFileError`` names the file and the first bad field."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            queries = {field: archive[field] for field in FIELDS + OPTIONAL_FIELDS if field in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise QueryFileError(f"{path}: not a readable queries file ({error})") from None
    validate(queries, path)
    if "absorbing" not in queries:  # a file written before the field existed, or by hand
        queries["absorbing"] = np.zeros(queries["reward"].shape, np.float32)
    return queries


def validate(queries: dict, path) -> None:
    """Raise ``QueryFileError`` at the first missing or inconsistent field."""
    def fail(field, message):
        raise QueryFileError(f"{path}: {field}: {message}")

    missing = [field for field in FIELDS if field not in queries]
    if missing:
        fail(missing[0], f"missing (a queries file needs {', '.join(FIELDS)})")
    ids, obs, pairs = queries["segment_ids"], queries["obs"], queries["pairs"]
    if ids.ndim != 1 or ids.dtype.kind != "U":
        fail("segment_ids", f"must be a 1-d str array, got {ids.dtype} {ids.shape}")
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        fail("segment_ids", f"duplicate id {str(unique[counts > 1][0])!r}")
    if obs.ndim < 2 or obs.shape[0] != len(ids):
        fail("obs", f"shape {obs.shape} must be [S={len(ids)}, L, *obs_shape]")
    for field in ("action", "reward"):
        if queries[field].shape[:2] != obs.shape[:2]:
            fail(field, f"shape {queries[field].shape} must start with [S, L]={list(obs.shape[:2])} like obs")
    if queries["reward"].ndim != 2:
        fail("reward", f"shape {queries['reward'].shape} must be [S, L]")
    if "absorbing" in queries:
        absorbing = queries["absorbing"]
        if absorbing.shape != queries["reward"].shape:
            fail("absorbing", f"shape {absorbing.shape} must be [S, L]={list(obs.shape[:2])} like obs")
        if not np.isin(absorbing, (0, 1)).all():
            fail("absorbing", "must hold only 0 and 1")
    if pairs.ndim != 2 or pairs.shape[1] != 2 or pairs.dtype.kind not in "iu":
        fail("pairs", f"must be an integer [P, 2] array, got {pairs.dtype} {pairs.shape}")
    bad = np.flatnonzero(((pairs < 0) | (pairs >= len(ids))).any(axis=1))
    if bad.size:
        fail("pairs", f"row {bad[0]} {pairs[bad[0]].tolist()} is out of range for {len(ids)} segments")
    same = np.flatnonzero(pairs[:, 0] == pairs[:, 1])
    if same.size:
        fail("pairs", f"row {same[0]} pairs segment {pairs[same[0], 0]} with itself")
    if queries["env"].ndim != 0 or queries["env"].dtype.kind != "U":
        fail("env", f"must be a 0-d str array, got {queries['env'].dtype} {queries['env'].shape}")


def known_segment_ids(queries: dict) -> set:
    """The segment ids of a queries dict, for ``read_labels(path, known_segments=...)``."""
    return set(queries["segment_ids"].tolist())
