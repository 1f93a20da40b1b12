"""ProceduralMaze: a sparsely rewarded grid maze whose layout is a pure function of a level id.

Made for generalization studies in the style of Procgen: train on a fixed set of
``N`` levels and evaluate on levels never seen in training. Because a level is
``generate_level(level_id, ...)``, the level sets are just integer ranges:

* train levels: ids ``[0, N)``                       -> ``num_levels=N, level_offset=0``
* test levels:  ids ``[1_000_000, 1_000_000 + M)``   -> ``num_levels=M, level_offset=1_000_000``
* unlimited:    ``num_levels <= 0`` draws ids from ``level_offset + [0, 2**30)``

Every reset draws a level id uniformly from the set. As the parameters are
pytree leaves, one compiled program can ``vmap`` over train and test settings.

**Grid.** ``size x size`` cells (default 9) with a wall border; each interior
cell is a wall with probability ``wall_density``. The agent and the goal stand
on distinct interior cells at Manhattan distance at least ``min(size // 2,
size - 3)``. A random monotone lattice path (the needed vertical and horizontal
moves in a random order) from the agent to the goal is cleared of walls, so
every level is solvable.

**Observation.** float32 ``[size, size, 3]``, one-hot channels (wall, agent,
goal), fully observed like MinAtar's grids, so the MLP and CNN torsos apply.

**Actions.** ``Discrete(4)``: up, right, down, left (row -1, column +1, row +1,
column -1). Moving into a wall leaves the agent where it is.

**Reward.** Sparse: on reaching the goal at step ``t`` (counting that step) the
reward is ``1 - 0.9 * t / max_steps_in_episode`` and the episode terminates;
every other step gives 0. Episodes are truncated (not terminated) after
``max_steps_in_episode`` steps. So the optimal return of a level is
``optimal_return(walls, agent_pos, goal_pos, max_steps)``, from the BFS
distance, which lets a study report the fraction of optimal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rlx.envs.mapf.env import distance_fields
from rlx.envs.registry import import_env_module
from rlx.errors import ConfigError

environment = import_env_module("gymnax.environments.environment")
spaces = import_env_module("gymnax.environments.spaces")

# Row and column change of each action: up, right, down, left.
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))
# Level keys are fold_in(LEVEL_KEY_SEED, level_id): one fixed stream, independent of training keys.
LEVEL_KEY_SEED = 20_240_601
# With num_levels <= 0 ("unlimited") level ids are level_offset + [0, UNLIMITED_LEVELS).
UNLIMITED_LEVELS = 2**30
# Success reward at step t is 1 - TIME_PENALTY * t / max_steps_in_episode.
TIME_PENALTY = 0.9


@struct.dataclass
class MazeParams(environment.EnvParams):
    num_levels: int = 0  # size of the level set; <= 0 means unlimited
    level_offset: int = 0  # first level id (1_000_000 for held-out test levels)
    wall_density: float = 0.3
    max_steps_in_episode: int = 64


EnvParams = MazeParams


@struct.dataclass
class MazeState(environment.EnvState):
    walls: jax.Array  # bool[size, size]
    agent_pos: jax.Array  # int32[2]: (row, column)
    goal_pos: jax.Array  # int32[2]
    level_id: jax.Array  # int32[]
    time: jax.Array  # int32[]: steps taken in this episode


# -- level generation ---------------------------------------------------------------------------
def min_goal_distance(size: int) -> int:
    """Least Manhattan distance between agent and goal: ``size // 2``, capped so every cell has a partner.

    From any cell of the ``(size-2) x (size-2)`` interior the farthest corner is at
    least ``size - 3`` away, so the cap keeps the goal's choice non-empty.
    """
    return min(size // 2, size - 3)


def interior_mask(size: int) -> jax.Array:
    """bool[size, size]: True off the border."""
    inside = jnp.zeros((size, size), bool)
    return inside.at[1:-1, 1:-1].set(True)


def _pick_cell(noise, allowed):
    """(row, column) of the largest ``noise`` among the True cells of ``allowed``: uniform for i.i.d. noise."""
    index = jnp.argmax(jnp.where(allowed, noise, -1.0))
    return jnp.stack(jnp.divmod(index, allowed.shape[1])).astype(jnp.int32)


def monotone_path(noise, start, goal) -> jax.Array:
    """int32[len(noise) + 1, 2]: cells of a random shortest lattice path from ``start`` to ``goal``.

    The ``|dr|`` vertical and ``|dc|`` horizontal moves are put in a random order
    (the ranks of ``noise``) among ``len(noise)`` slots, the rest being stays, so
    the path has a fixed shape; ``len(noise)`` must be at least ``|dr| + |dc|``.
    """
    delta = goal - start
    slots = jnp.argsort(noise)  # a uniformly random permutation of 0..L-1
    vertical = slots < jnp.abs(delta[0])
    horizontal = (slots >= jnp.abs(delta[0])) & (slots < jnp.abs(delta).sum())
    steps = jnp.stack([vertical * jnp.sign(delta[0]), horizontal * jnp.sign(delta[1])], -1)
    offsets = jnp.concatenate([jnp.zeros((1, 2), jnp.int32), jnp.cumsum(steps, 0)])
    return (start + offsets).astype(jnp.int32)


def generate_level(level_id, size: int = 9, wall_density=0.3):
    """Return ``(walls bool[size, size], agent_pos int32[2], goal_pos int32[2])`` for a level id.

    Pure and jittable (``size`` is static; ``level_id`` and ``wall_density`` may
    be traced): the same id always gives the same layout, and the layout is
    solvable by construction (see the module docstring). All randomness comes
    from one uniform draw, which keeps the compiled program small (it runs at
    every auto-reset).
    """
    key = jax.random.fold_in(jax.random.PRNGKey(LEVEL_KEY_SEED), level_id)
    path_length = 2 * (size - 2)
    noise = jax.random.uniform(key, (3 * size * size + path_length,))
    wall_noise, agent_noise, goal_noise = noise[: 3 * size * size].reshape(3, size, size)
    inside = interior_mask(size)
    walls = ~inside | (wall_noise < wall_density)
    agent_pos = _pick_cell(agent_noise, inside)
    rows, cols = jnp.meshgrid(jnp.arange(size), jnp.arange(size), indexing="ij")
    distance = jnp.abs(rows - agent_pos[0]) + jnp.abs(cols - agent_pos[1])
    goal_pos = _pick_cell(goal_noise, inside & (distance >= min_goal_distance(size)))
    path = monotone_path(noise[3 * size * size :], agent_pos, goal_pos)
    walls = walls.at[path[:, 0], path[:, 1]].set(False)
    return walls, agent_pos, goal_pos


# -- distances ----------------------------------------------------------------------------------
def distance_map(walls, start) -> jax.Array:
    """int32[size, size]: BFS step counts from ``start`` over free cells; -1 where unreachable.

    The breadth-first search is MAPF's ``distance_fields`` (fixed-shape relaxations in a
    ``while_loop``, so it runs under jit and vmap); on a 4-connected grid the distance to
    ``start`` is the distance from it.
    """
    distances = distance_fields(walls, start[None], walls.shape)[0]
    return jnp.where(distances >= walls.size, -1, distances)  # distance_fields marks unreachable as H * W


def reachable(walls, start) -> jax.Array:
    """bool[size, size]: the cells the agent can reach from ``start`` (flood fill)."""
    return distance_map(walls, start) >= 0


def shortest_path_length(walls, start, goal) -> jax.Array:
    """int32[]: fewest moves from ``start`` to ``goal`` avoiding walls; -1 if there is no path."""
    return distance_map(walls, start)[goal[0], goal[1]]


def optimal_return(walls, agent_pos, goal_pos, max_steps) -> jax.Array:
    """float32[]: the best achievable return of a level, ``1 - 0.9 d / T`` for BFS distance ``d``.

    0 when the goal is unreachable or farther than ``max_steps`` moves.
    """
    d = shortest_path_length(walls, agent_pos, goal_pos)
    solvable = (d >= 0) & (d <= max_steps)
    return jnp.where(solvable, 1.0 - TIME_PENALTY * d / max_steps, 0.0).astype(jnp.float32)


# -- the environment ----------------------------------------------------------------------------
class ProceduralMaze(environment.Environment):
    """Reach the goal in a procedurally generated maze; see the module docstring."""

    def __init__(self, size: int = 9):
        if size < 4:
            raise ValueError(f"size={size!r}: must be >= 4 (a wall border around at least 2x2 cells)")
        self.size = size

    @property
    def default_params(self) -> MazeParams:
        return MazeParams()

    def check_params(self, params: MazeParams) -> MazeParams:
        """Reject, before tracing, values the level sampler or the reward cannot use."""
        if not 0.0 <= params.wall_density < 1.0:
            raise ConfigError(f"env.params.wall_density: {params.wall_density} must be in [0, 1)")
        if not params.max_steps_in_episode >= 1:
            raise ConfigError(f"env.params.max_steps_in_episode: {params.max_steps_in_episode} must be >= 1")
        if not params.level_offset >= 0:
            raise ConfigError(f"env.params.level_offset: {params.level_offset} must be >= 0")
        count = params.num_levels if params.num_levels > 0 else UNLIMITED_LEVELS
        if params.level_offset + count > 2**31 - 1:
            raise ConfigError("env.params.level_offset: level_offset + num_levels must fit in int32 (< 2**31)")
        return params

    # -- levels ------------------------------------------------------------------------------------
    def sample_level_id(self, key, params: MazeParams) -> jax.Array:
        """int32[]: ``level_offset + uniform[0, num_levels)``, or ``[0, 2**30)`` when num_levels <= 0."""
        count = jnp.where(params.num_levels > 0, params.num_levels, UNLIMITED_LEVELS)
        return (params.level_offset + jax.random.randint(key, (), 0, count)).astype(jnp.int32)

    def level_state(self, level_id, params: MazeParams) -> MazeState:
        """The start state of a level."""
        walls, agent_pos, goal_pos = generate_level(level_id, self.size, params.wall_density)
        level_id = jnp.asarray(level_id, jnp.int32)
        return MazeState(walls=walls, agent_pos=agent_pos, goal_pos=goal_pos, level_id=level_id, time=jnp.int32(0))

    def reset_to_level(self, level_id, params: MazeParams):
        """``(obs, state)`` at the start of a chosen level, e.g. to evaluate every test level once."""
        state = self.level_state(level_id, params)
        return self.get_obs(state, params), state

    def reset_env(self, key, params):
        return self.reset_to_level(self.sample_level_id(key, params), params)

    # -- dynamics ---------------------------------------------------------------------------------
    def step_env(self, key, state, action, params):
        target = jnp.clip(state.agent_pos + jnp.asarray(MOVES, jnp.int32)[action], 0, self.size - 1)
        blocked = state.walls[target[0], target[1]]
        agent_pos = jnp.where(blocked, state.agent_pos, target)
        time = state.time + 1
        at_goal = jnp.all(agent_pos == state.goal_pos)
        reward = jnp.where(at_goal, 1.0 - TIME_PENALTY * time / params.max_steps_in_episode, 0.0)
        new_state = state.replace(agent_pos=agent_pos, time=time)
        return self.get_obs(new_state, params), new_state, reward.astype(jnp.float32), at_goal, {}

    def get_obs(self, state, params=None, key=None) -> jax.Array:
        """float32[size, size, 3]: one-hot channels wall, agent, goal."""
        empty = jnp.zeros((self.size, self.size), bool)
        agent = empty.at[state.agent_pos[0], state.agent_pos[1]].set(True)
        goal = empty.at[state.goal_pos[0], state.goal_pos[1]].set(True)
        return jnp.stack([state.walls, agent, goal], -1).astype(jnp.float32)

    def is_terminated(self, state, params) -> jax.Array:
        return jnp.all(state.agent_pos == state.goal_pos)

    # -- spaces -----------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return "ProceduralMaze"

    @property
    def num_actions(self) -> int:
        return len(MOVES)

    def action_space(self, params=None):
        return spaces.Discrete(self.num_actions)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (self.size, self.size, 3), jnp.float32)

    def state_space(self, params):
        cell = spaces.Box(0, self.size - 1, (2,), jnp.int32)
        return spaces.Dict(
            {
                "walls": spaces.Box(0, 1, (self.size, self.size), jnp.bool_),
                "agent_pos": cell,
                "goal_pos": cell,
                "level_id": spaces.Discrete(2**31 - 1),
                "time": spaces.Discrete(params.max_steps_in_episode + 1),
            }
        )
