"""A vectorised multi-agent path finding environment with POGEMA's semantics, in JAX.

Agents move on a 4-connected grid (actions: 0 wait, 1 up, 2 down, 3 left,
4 right; a move into an obstacle or off the map is a wait). Each agent sees a
``(2R+1) x (2R+1)`` window around itself with three channels (obstacles,
agents, its target projected onto the window's border when outside it),
channels last, as 0/1 ``uint8``. The environment follows the array-per-agent contract of
``rlx.envs.multi_agent``.

Instances (map, starts, goal sequences) come from a pool in the parameters,
made on the host by ``rlx.envs.mapf.instances``; ``reset`` draws one, so maps
of different sizes batch together (each stored at the pool's maximum size,
padded with obstacles, with its true size alongside).

Collision systems, as POGEMA 1.4 resolves a joint move (``t_i``: agent i's
target cell, ``p_i``: its cell):

- ``soft``: swaps are refused; then, until nothing changes, every cell wanted
  by several agents goes to the agent already standing there if any, else to
  the lowest index, and the others wait (a cascade). Following and rotations
  of three or more agents are allowed.
- ``priority``: agents move one at a time in index order into cells free at
  that moment (a follower must have a higher index than the agent it follows).
- ``block_both``: an agent moves only if its target is free at the start of the
  step and wanted by no other agent.

``on_target`` modes: ``finish`` (an agent on its goal gets +1, terminates and
leaves the grid), ``nothing`` (classical MAPF: every agent gets +1 and the
episode ends only when all stand on their goals at once), ``restart``
(lifelong: +1 on arrival and the next goal of the agent's sequence, or a
uniformly random cell of its connected component, at once).

Deliberate difference from POGEMA: under ``soft`` collisions POGEMA's agents
channel can miss an agent that followed a higher-index agent (its occupancy map
is written in index order); ours is drawn from the positions, so it never does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlx.envs.mapf import tie_noise
from rlx.envs.multi_agent import MultiAgentEnv
from rlx.envs.registry import import_env_module
from rlx.errors import ConfigError

spaces = import_env_module("gymnax.environments.spaces")

MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)  # wait, up, down, left, right
COLLISION_SYSTEMS = ("soft", "priority", "block_both")
ON_TARGET_MODES = ("finish", "nothing", "restart")
OBSERVATIONS = ("local", "local_path", "map", "map_priority", "map_noise", "map_defer", "map_route", "map_rank",
                "map_corridor")
# whole-map planes plus a "this is me" plane; those that also show the step's tie-break numbers
MAP_OBSERVATIONS = ("map", "map_priority", "map_noise", "map_defer", "map_route", "map_rank", "map_corridor")
NOISE_OBSERVATIONS = ("map_noise", "map_defer", "map_route", "map_rank", "map_corridor")
# those that show PIBT's priorities (priority_planes), and those whose agents defer at goal pockets (deferred)
PRIORITY_OBSERVATIONS = ("map_priority",) + NOISE_OBSERVATIONS
DEFER_OBSERVATIONS = ("map_defer", "map_route", "map_rank", "map_corridor")
MAP_CHANNELS = 8  # see MapfEnv.map_features
MOVE_PLANES = 3  # the first of map_features' four per-move channels
PRIORITY_CHANNELS = 2  # see MapfEnv.priority_planes ("map_priority" observations)
RANK_CHANNELS = 4  # see MapfEnv.rank_planes ("map_rank" observations): one per move, up, down, left, right
RANK_PLANES = MAP_CHANNELS + PRIORITY_CHANNELS + 1  # where they start: after the map's, priority and noise planes
CORRIDOR_CHANNELS = 4  # see MapfEnv.dead_end_planes ("map_corridor" observations), at RANK_PLANES: one per move
POCKET_INNER, POCKET_WAY = 1, 2  # goal_pockets codes: the region a goal shuts off, the goal and its corridor
ROUTE_PENALTY = 4  # routed_distances: steps a way through a resting agent costs beyond its length


@struct.dataclass
class MapfParams:
    """A pool of instances at a common maximum size ``H x W`` with ``N`` agent slots and goal sequences of length ``K``.

    ``blocked`` is True on obstacles and outside each map's true ``sizes``;
    ``agent_mask`` is False for unused agent slots (maps with fewer agents);
    ``components`` labels each map's connected free regions (-1 on obstacles),
    used to draw lifelong goals when ``random_goals`` is set.
    """

    blocked: jax.Array        # bool[M, H, W]
    sizes: jax.Array          # int32[M, 2] (height, width)
    starts: jax.Array         # int32[M, N, 2] (row, column)
    goals: jax.Array          # int32[M, N, K, 2]
    agent_mask: jax.Array     # bool[M, N]
    components: jax.Array     # int32[M, H, W]
    random_goals: bool = struct.field(pytree_node=False, default=False)
    max_steps_in_episode: int = 64
    expert_actions: jax.Array | None = None  # int8[M, T, N]: an expert's joint actions (0 after it is done)
    behaviour_actions: jax.Array | None = None  # int8[M, T, N]: actions that reach the states labelled by
                                                # expert_actions when they are not the expert's own (DAgger)
    goal_distances: jax.Array | None = None  # int16[M, N, H, W] (int32 past 32,767 cells): fields to the first goals
    committed_actions: jax.Array | None = None  # int8[M, T, N]: DAgger's recorded decoding rounds: the action an
                                                # agent had committed to when the others were labelled (-1: none)
    initial_observations: jax.Array | None = None  # [M, N, ...]: each entry's local observations at time 0
                                                   # (``MapfEnv.with_initial_observations``)


@struct.dataclass
class MapfState:
    instance: jax.Array       # which pool entry
    positions: jax.Array      # int32[N, 2]
    goal_index: jax.Array     # int32[N]: position in the goal sequence
    goals: jax.Array          # int32[N, 2]: the current goals
    active: jax.Array         # bool[N]: on the grid and acting (not finished, slot in use)
    arrived_at: jax.Array     # int32[N]: step of the last arrival on the current goal (0: none)
    on_goal_since: jax.Array  # int32[N]: first step of the current uninterrupted stay on the goal (0: not on it)
    last_on_goal: jax.Array   # int32[N]: last step the agent stood on its goal (lifelong: or reached the last one; -1: never)
    goals_reached: jax.Array  # int32: goal arrivals so far (every mode)
    time: jax.Array           # int32
    key: jax.Array
    distances: jax.Array      # int32[N, H, W] to the current goals ("map" observations), else [0]
    pockets: jax.Array        # int8[N, H, W]: goal_pockets of the goals ("map_defer" in nothing mode), else [0]
    dead_ends: jax.Array      # float32[H, W, 4]: dead_end_planes of the map ("map_corridor"), else [0]


class MapfEnv(MultiAgentEnv):
    """POGEMA-style MAPF over an instance pool; ``num_agents`` slots, observation radius ``obs_radius``."""

    def __init__(self, num_agents: int, obs_radius: int = 5, collision_system: str = "soft",
                 on_target: str = "nothing", pool: MapfParams | None = None, observation: str = "local",
                 progress_reward: float = 0.0):
        if collision_system not in COLLISION_SYSTEMS:
            raise ConfigError(f"collision_system={collision_system!r}: valid: {', '.join(COLLISION_SYSTEMS)}")
        if on_target not in ON_TARGET_MODES:
            raise ConfigError(f"on_target={on_target!r}: valid: {', '.join(ON_TARGET_MODES)}")
        if obs_radius < 1:
            raise ConfigError(f"obs_radius={obs_radius}: must be >= 1")
        if observation not in OBSERVATIONS:
            raise ConfigError(f"observation={observation!r}: valid: {', '.join(OBSERVATIONS)}")
        if progress_reward < 0:
            raise ConfigError(f"progress_reward={progress_reward}: must be >= 0")
        self.observation = observation
        self.progress_reward = float(progress_reward)
        # distance fields to the goals: whole-map features, path windows and the progress reward read them
        self.needs_distances = observation != "local" or self.progress_reward > 0
        # agents keep off goals that would shut others out of a pocket (the pibt_swap_defer teacher's rule)
        self.defers = observation in DEFER_OBSERVATIONS and on_target == "nothing"
        # agents off their goals plan around resting ones (the pibt_swap_route teacher's rule)
        self.routes = observation == "map_route" and on_target == "nothing"
        self.num_agents = num_agents
        self.obs_radius = obs_radius
        self.collision_system = collision_system
        self.on_target = on_target
        self._pool = pool

    @property
    def move_planes(self) -> tuple[int, ...]:
        """Where whole-map observations hold one plane per move (up, down, left, right: ``map_features``'
        distance changes), for policies that train on turned or mirrored maps (``map_policy``'s ``augment``)."""
        if self.observation in ("map_rank", "map_corridor"):
            return MOVE_PLANES, RANK_PLANES
        return (MOVE_PLANES,) if self.observation in MAP_OBSERVATIONS else ()

    @property
    def default_params(self) -> MapfParams:
        if self._pool is None:
            raise ConfigError("MapfEnv needs an instance pool: MapfEnv(..., pool=instances.pool(...))")
        return self._pool

    @property
    def name(self) -> str:
        return f"MAPF-{self.collision_system}-{self.on_target}"

    # -- reset and step ------------------------------------------------------------------------------
    def reset_env(self, key, params: MapfParams):
        pick_key, key = jax.random.split(key)
        instance = jax.random.randint(pick_key, (), 0, params.blocked.shape[0])
        return self.reset_to(instance, key, params)

    def reset_to(self, instance, key, params: MapfParams):
        """(observations, state) of pool entry ``instance`` at time 0."""
        n = self.num_agents
        positions = params.starts[instance]
        goals = params.goals[instance, :, 0]
        state = MapfState(
            instance=jnp.asarray(instance, jnp.int32),
            positions=positions,
            goal_index=jnp.zeros(n, jnp.int32),
            goals=goals,
            active=params.agent_mask[instance],
            arrived_at=jnp.zeros(n, jnp.int32),
            on_goal_since=jnp.zeros(n, jnp.int32),
            last_on_goal=jnp.full(n, -1, jnp.int32),
            goals_reached=jnp.asarray(0, jnp.int32),
            time=jnp.asarray(0, jnp.int32),
            key=key,
            distances=jnp.zeros(1, jnp.int32),
            pockets=(goal_pockets(params.blocked[instance], goals, params.sizes[instance]) if self.defers
                     else jnp.zeros(1, jnp.int8)),
            # Fixed by the map, so computed once per episode: a fixed point per observation would triple
            # the cost of an imitation update.
            dead_ends=(dead_end_planes(params.blocked[instance]) if self.observation == "map_corridor"
                       else jnp.zeros(1, jnp.float32)),
        )
        state = self._with_distances(state, params)
        settled = jnp.all(positions == goals, -1) | self.deferred(state, params)
        state = state.replace(last_on_goal=jnp.where(settled, 0, -1).astype(jnp.int32))
        if params.initial_observations is not None:
            return self._stored_initial_observations(params)[instance], state
        return self.observations(state, params), state

    def with_initial_observations(self, params: MapfParams) -> MapfParams:
        """``params`` with every pool entry's observations at time 0 stored in it. An auto-reset then reads
        the fresh episode's observations there instead of observing its state, so a step observes one state
        (the one it reached, which ``final_observation`` needs anyway) instead of two. Local windows only:
        whole-map observations (``[N, H, W, C]`` per entry) would cost more memory than they save time."""
        if self.observation in MAP_OBSERVATIONS:
            raise ConfigError(f"observation={self.observation!r}: only local observations can be stored "
                              f"per pool entry ({', '.join(o for o in OBSERVATIONS if o not in MAP_OBSERVATIONS)})")
        entries = jnp.arange(params.blocked.shape[0])
        fresh = params.replace(initial_observations=None)
        observe = jax.jit(jax.vmap(lambda entry: self.reset_to(entry, jax.random.PRNGKey(0), fresh)[0]))
        return params.replace(initial_observations=observe(entries))

    def _stored_initial_observations(self, params: MapfParams) -> jax.Array:
        stored = params.initial_observations
        space = self.observation_space(params)
        expected = (params.blocked.shape[0], self.num_agents) + tuple(space.shape)
        if stored.shape != expected or stored.dtype != space.dtype:
            raise ConfigError(f"initial_observations {stored.dtype}{list(stored.shape)} do not fit this "
                              f"environment's {space.dtype}{list(expected)} (observation={self.observation!r}, "
                              f"obs_radius={self.obs_radius}): store them with this env's with_initial_observations")
        return stored

    def _with_distances(self, state: MapfState, params: MapfParams, changed=None) -> MapfState:
        """Distance fields to the current goals, kept in the state when ``needs_distances`` (at a reset
        read from the pool's ``goal_distances`` when it has them; recomputed only when a goal changed,
        in lifelong mode)."""
        if not self.needs_distances:
            return state
        compute = lambda: distance_fields(params.blocked[state.instance], state.goals,  # noqa: E731
                                          params.sizes[state.instance])
        if changed is None:
            if params.goal_distances is not None:
                return state.replace(distances=params.goal_distances[state.instance].astype(jnp.int32))
            return state.replace(distances=compute())
        return state.replace(distances=jax.lax.cond(jnp.any(changed), compute, lambda: state.distances))

    def step_env(self, key, state: MapfState, actions, params: MapfParams):
        blocked = params.blocked[state.instance]
        size = params.sizes[state.instance]
        positions = move(self.collision_system, blocked, size, state.positions, actions, state.active)
        progress = self._progress(state, positions) if self.progress_reward > 0 else 0.0
        time = state.time + 1
        present = params.agent_mask[state.instance]
        on_goal = jnp.all(positions == state.goals, axis=-1) & present
        arriving = on_goal & state.active
        newly = arriving & (state.on_goal_since == 0)  # was not on this goal before the step
        state = state.replace(positions=positions, time=time,
                              last_on_goal=jnp.where(on_goal | self.deferred(state.replace(positions=positions),
                                                                             params), time, state.last_on_goal),
                              on_goal_since=jnp.where(on_goal, jnp.where(newly, time, state.on_goal_since), 0),
                              goals_reached=state.goals_reached + jnp.sum(newly),
                              arrived_at=jnp.where(newly & (state.arrived_at == 0), time, state.arrived_at))
        if self.on_target == "finish":
            rewards = arriving.astype(jnp.float32)
            state = state.replace(active=state.active & ~on_goal)
            terminated = ~state.active
        elif self.on_target == "nothing":
            solved = jnp.all(on_goal | ~present)
            rewards = jnp.full(self.num_agents, solved, jnp.float32) * present
            terminated = jnp.broadcast_to(solved, (self.num_agents,)) | ~present
        else:
            rewards = newly.astype(jnp.float32)  # as arriving, unless a goal was handed out under foot
            state = self._with_distances(self._next_goals(key, state, newly, params), params, newly)
            terminated = ~present
            on_goal = jnp.all(positions == state.goals, axis=-1) & present  # the new goals, as POGEMA reports
        info = {"on_goal": on_goal, **self.metrics(state, params)}
        rewards = rewards + self.progress_reward * progress
        return self.observations(state, params), state, rewards, terminated, info

    def _progress(self, state: MapfState, positions) -> jax.Array:
        """``float32[N]``: how much each acting agent's move shortened its path to its goal (+1, 0 or -1)."""
        index = jnp.arange(self.num_agents)
        before = state.distances[index, state.positions[:, 0], state.positions[:, 1]]
        after = state.distances[index, positions[:, 0], positions[:, 1]]
        return jnp.where(state.active, before - after, 0).astype(jnp.float32)

    def _next_goals(self, key, state: MapfState, arriving, params: MapfParams) -> MapfState:
        """Lifelong mode: each arriving agent's next goal, from its sequence or drawn in its component."""
        if params.random_goals:
            components = params.components[state.instance]
            drawn = jax.vmap(random_cell_in_component, in_axes=(0, None, 0))(
                jax.random.split(key, self.num_agents), components, state.positions)
            goals = jnp.where(arriving[:, None], drawn, state.goals)
            index = state.goal_index + arriving
        else:
            length = params.goals.shape[2]
            index = jnp.where(arriving, (state.goal_index + 1) % length, state.goal_index)
            goals = params.goals[state.instance, jnp.arange(self.num_agents), index]
        # A next goal on the agent's own cell (alone in its component, or a sequence that returns to where it
        # stands) counts as reached only once the agent has left it and come back: no reward for waiting on it.
        standing_on_it = jnp.all(goals == state.positions, axis=-1)
        return state.replace(goals=goals, goal_index=index,
                             arrived_at=jnp.where(arriving, 0, state.arrived_at),
                             on_goal_since=jnp.where(arriving, jnp.where(standing_on_it, state.time, 0),
                                                     state.on_goal_since))

    # -- what agents and critics see ----------------------------------------------------------------
    def observations(self, state: MapfState, params: MapfParams) -> jax.Array:
        """Local windows (``observation="local"``), or the whole map's features plus a "this is me"
        plane (``"map"``: ``float32[N, H, W, MAP_CHANNELS + 1]``, for centralized map-based policies;
        ``"map_priority"``: the same with ``priority_planes`` after the map's channels; ``"map_noise"``:
        then also the step's ``tie_noise_plane``; ``"map_defer"``: the channels of ``"map_noise"``, with
        deferred agents' moves and waiting as the ``pibt_swap_defer`` teacher sees them: ``deferred``); ``"map_route"``:
        the channels of ``"map_defer"``, with the moves of agents off their goals as the ``pibt_swap_route`` teacher
        ranks them: ``routed_distances``); ``"map_rank"``: the channels of ``"map_defer"``, then ``rank_planes``;
        ``"map_corridor"``: the channels of ``"map_defer"``, then ``dead_end_planes``)."""
        if self.observation in MAP_OBSERVATIONS:
            features = self.map_features(state, params)
            if self.observation in PRIORITY_OBSERVATIONS:
                features = jnp.concatenate([features, self.priority_planes(state, params)], axis=-1)
            if self.observation in NOISE_OBSERVATIONS:
                features = jnp.concatenate([features, self.tie_noise_plane(state, params)[..., None]], axis=-1)
            if self.observation == "map_rank":
                features = jnp.concatenate([features, self.rank_planes(state, params)], axis=-1)
            if self.observation == "map_corridor":
                features = jnp.concatenate([features, state.dead_ends], axis=-1)
            me = jnp.zeros((self.num_agents,) + features.shape[:2], jnp.float32).at[
                jnp.arange(self.num_agents), state.positions[:, 0], state.positions[:, 1]].set(
                state.active.astype(jnp.float32))
            shared = jnp.broadcast_to(features, (self.num_agents,) + features.shape)
            return jnp.concatenate([shared, me[..., None]], axis=-1)
        windows = self.local_observations(state, params)
        if self.observation == "local_path":
            return jnp.concatenate([windows.astype(jnp.float32), self.path_windows(state, params)[..., None]], axis=-1)
        return windows

    def map_features(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[H, W, MAP_CHANNELS]``: what a whole-map policy sees, per cell.

        Channels: obstacle; an active agent; an active agent's goal; then, for the
        agent on the cell, whether each move (up, down, left, right) lowers (-1),
        keeps (0) or raises/blocks (+1) its shortest-path distance to its goal
        (a ``deferred`` agent's: its distance plus a penalty on its goal's pocket; with ``map_route``, an agent
        off its goal's: ``routed_distances``);
        and whether it stands on its goal.
        """
        blocked = params.blocked[state.instance]
        height, width = blocked.shape
        weight = state.active.astype(jnp.float32)
        rows, cols = state.positions[:, 0], state.positions[:, 1]
        agents = jnp.zeros(blocked.shape, jnp.float32).at[rows, cols].max(weight)
        goals = jnp.zeros(blocked.shape, jnp.float32).at[state.goals[:, 0], state.goals[:, 1]].max(weight)
        far = height * width
        distances = state.distances
        if self.routes:
            resting = jnp.all(state.positions == state.goals, -1) & params.agent_mask[state.instance]
            around = jnp.zeros(blocked.shape, bool).at[rows, cols].max(resting)
            distances = jnp.where(resting[:, None, None], distances,
                                  routed_distances(blocked, state.goals, params.sizes[state.instance], distances,
                                                   around))
        if self.defers:
            distances = jnp.where(self.deferred(state, params)[:, None, None],
                                  deferred_distances(state.distances, state.pockets), distances)
        padded = jnp.pad(distances, ((0, 0), (1, 1), (1, 1)), constant_values=far)
        walls = jnp.pad(blocked, 1, constant_values=True)
        index = jnp.arange(self.num_agents)
        here = distances[index, rows, cols]
        deltas = jnp.stack([jnp.where(walls[rows + 1 + dr, cols + 1 + dc], far * 3, padded[index, rows + 1 + dr, cols + 1 + dc])
                            for dr, dc in MOVES[1:]], -1)
        deltas = jnp.clip(deltas - here[:, None], -1, 1).astype(jnp.float32)
        on_goal = jnp.all(state.positions == state.goals, -1).astype(jnp.float32)
        per_agent = jnp.concatenate([deltas, on_goal[:, None]], -1) * weight[:, None]
        planes = jnp.zeros(blocked.shape + (5,), jnp.float32).at[rows, cols].add(per_agent)
        return jnp.concatenate([blocked[..., None].astype(jnp.float32), agents[..., None], goals[..., None], planes],
                               axis=-1)

    def waiting_steps(self, state: MapfState) -> jax.Array:
        """``int32[N]``: steps since each agent last stood on its current goal (0 while on it; ``time + 1``
        if never), the integer part of PIBT's priority for its next step (``experts.raise_priorities``).
        With ``map_defer``, being ``deferred`` counts as standing on the goal, as for that teacher."""
        return state.time - state.last_on_goal

    def deferred(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``bool[N]``: agents that keep off their goals for now (``experts.deferred``; only ``map_defer`` in
        ``nothing`` mode, else none): another agent whose goal lies in the region that an agent's goal cuts
        off (``goal_pockets``) has not arrived and is still outside it."""
        if not self.defers:
            return jnp.zeros(self.num_agents, bool)
        goals, positions, present = state.goals, state.positions, params.agent_mask[state.instance]
        inner_goal = state.pockets[:, goals[:, 0], goals[:, 1]] == POCKET_INNER  # [i, j]: j's goal in i's pocket
        inner_here = state.pockets[:, positions[:, 0], positions[:, 1]] == POCKET_INNER
        away = jnp.any(positions != goals, axis=-1) & present
        return jnp.any(inner_goal & away[None, :] & ~inner_here, axis=1) & present

    def priority_planes(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[H, W, PRIORITY_CHANNELS]``: on each active agent's cell, what PIBT ranks agents by.

        PIBT (``experts.pibt``) lets agents plan in decreasing priority: the steps
        since each last stood on its goal, ties broken by a number below 1
        (``tiebreak="index"``: higher for lower indices, the order in which
        ``soft`` collisions award contested cells). The map planes alone do not
        show either, so a policy imitating PIBT cannot tell who yields to whom;
        these planes do, from the episode's own history:

        - the waiting steps (``waiting_steps``) over the horizon, clipped to 1;
        - the tie-breaker ``(n - 1 - i) / n`` of agent ``i``, ``n`` the instance's agents (its used slots,
          so that instances with fewer agents than slots look as they would on their own).
        """
        blocked = params.blocked[state.instance]
        weight = state.active.astype(jnp.float32)
        waiting = jnp.minimum(self.waiting_steps(state) / params.max_steps_in_episode, 1.0)
        per_agent = jnp.stack([waiting, self.tiebreakers(state, params)], -1).astype(jnp.float32) * weight[:, None]
        rows, cols = state.positions[:, 0], state.positions[:, 1]
        return jnp.zeros(blocked.shape + (PRIORITY_CHANNELS,), jnp.float32).at[rows, cols].add(per_agent)

    def tiebreakers(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[N]``: PIBT's index tie-breaker ``(n - 1 - i) / n`` of agent ``i``, ``n`` the instance's agents."""
        count = jnp.maximum(jnp.sum(params.agent_mask[state.instance]), 1)
        return ((count - 1 - jnp.arange(self.num_agents)) / count).astype(jnp.float32)

    def priorities(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[N]``: PIBT's priority of each agent for its next step, the waiting steps plus the
        tie-breaker, which ``priority_planes`` show apart (``experts.pibt``'s ``priority``); -1 for inactive slots."""
        return jnp.where(state.active, self.waiting_steps(state) + self.tiebreakers(state, params), -1.0)

    def rank_planes(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[H, W, RANK_CHANNELS]``: on each active agent's cell, per move (up, down, left, right),
        +1 where the neighbouring cell holds an agent that PIBT lets plan first (a higher ``priorities``),
        -1 where it holds one that plans after, 0 where it holds none.

        ``priority_planes`` show the same order as two numbers per agent, but neighbours' waiting steps
        often differ by one step in 128, and who pushes whom (PIBT's priority inheritance) turns on
        exactly that comparison; these planes state it outright."""
        blocked = params.blocked[state.instance]
        priority = self.priorities(state, params)
        rows, cols = state.positions[:, 0], state.positions[:, 1]
        grid = jnp.full(blocked.shape, -1.0, jnp.float32).at[rows, cols].max(priority)
        padded = jnp.pad(grid, 1, constant_values=-1.0)
        neighbours = jnp.stack([padded[rows + 1 + dr, cols + 1 + dc] for dr, dc in MOVES[1:]], -1)
        signs = jnp.where(neighbours < 0, 0.0, jnp.where(neighbours > priority[:, None], 1.0, -1.0))
        per_agent = signs * state.active.astype(jnp.float32)[:, None]
        return jnp.zeros(blocked.shape + (RANK_CHANNELS,), jnp.float32).at[rows, cols].add(per_agent)

    def tie_noise_plane(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[H, W]``: this step's shared tie-break numbers (``tie_noise``), by which the
        ``pibt_swap_noise`` teacher chooses among equally good moves."""
        seed = tie_noise.instance_seed(params.starts[state.instance], params.agent_mask[state.instance], jnp)
        return tie_noise.noise_grid(seed, state.time, *params.blocked.shape[1:], xp=jnp)

    def local_observations(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``uint8[N, 2R+1, 2R+1, 3]``: obstacles, agents (self included), projected target, as 0 or 1.

        POGEMA's windows are float32; bytes are four times fewer in ``uint8``, which is what moving them
        costs (policies cast them to float at their input)."""
        r = self.obs_radius
        window = 2 * r + 1
        padded = pogema_padding(params.blocked[state.instance], params.sizes[state.instance], r).astype(jnp.uint8)
        # One grid with obstacles in bit 0 and agents in bit 1, cut once per agent. Written by a scatter, it
        # is stored before the cutting; XLA would otherwise recompute the padding for every window cell.
        rows, cols = state.positions[:, 0] + r, state.positions[:, 1] + r
        cells = padded.at[rows, cols].max(padded[rows, cols] | (state.active.astype(jnp.uint8) << 1))
        line = jnp.arange(window)

        def one(position, goal):
            around = jax.lax.dynamic_slice(cells, (position[0], position[1]), (window, window))
            offset = jnp.clip(goal - position, -r, r) + r
            target = (line[:, None] == offset[0]) & (line[None, :] == offset[1])
            return jnp.stack([around & 1, around >> 1, target], axis=-1).astype(jnp.uint8)

        return jax.vmap(one)(state.positions, state.goals)

    def path_windows(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[N, 2R+1, 2R+1]``: around each agent, how much farther from its goal each cell is than
        its own, in units of ``2R`` and clipped to [-1, 1] (walls, the outside and cut-off cells: 1).

        The ``local_path`` observation's fourth channel: the shortest-path direction that strong
        decentralized MAPF methods give their agents, and every detour's cost beside it.
        """
        r = self.obs_radius
        window = 2 * r + 1
        far = state.distances.shape[1] * state.distances.shape[2]
        padded = jnp.pad(state.distances, ((0, 0), (r, r), (r, r)), constant_values=far)

        def one(field, position):
            here = field[position[0] + r, position[1] + r]
            around = jax.lax.dynamic_slice(field, (position[0], position[1]), (window, window))
            return jnp.clip((around - here) / (2 * r), -1.0, 1.0)

        return jax.vmap(one)(padded, state.positions).astype(jnp.float32)

    def world_state(self, state: MapfState, params: MapfParams) -> jax.Array:
        """``float32[H, W, 4]``: obstacles, active agents, their goals, and the time left as a constant plane."""
        blocked = params.blocked[state.instance]
        weight = state.active.astype(jnp.float32)
        agents = jnp.zeros(blocked.shape, jnp.float32).at[state.positions[:, 0], state.positions[:, 1]].max(weight)
        goals = jnp.zeros(blocked.shape, jnp.float32).at[state.goals[:, 0], state.goals[:, 1]].max(weight)
        left = jnp.full(blocked.shape, 1.0 - state.time / params.max_steps_in_episode, jnp.float32)
        return jnp.stack([blocked.astype(jnp.float32), agents, goals, left], axis=-1)

    def metrics(self, state: MapfState, params: MapfParams) -> dict:
        """POGEMA's episode metrics of the state so far (read them on the step the episode ends).

        ``isr``: fraction of agents on their goal (``finish``: that ever reached it);
        ``csr``: 1 if all are; ``soc``: sum over agents of the step from which
        each stayed on its goal (``finish``: its arrival step), or the steps so far
        if it is not there; ``makespan``: the largest of those; ``throughput``:
        goals reached per step so far.
        """
        present = params.agent_mask[state.instance]
        count = jnp.maximum(jnp.sum(present), 1)
        if self.on_target == "finish":
            done = (state.arrived_at > 0) & present
            cost = jnp.where(done, state.arrived_at, state.time)
        else:
            done = (state.on_goal_since > 0) & present
            cost = jnp.where(done, state.on_goal_since, state.time)
        cost = jnp.where(present, cost, 0)
        return {
            "isr": jnp.sum(done) / count,
            "csr": jnp.all(done | ~present).astype(jnp.float32),
            "soc": jnp.sum(cost).astype(jnp.float32),
            "makespan": jnp.max(cost).astype(jnp.float32),
            "throughput": state.goals_reached / jnp.maximum(state.time, 1),
        }

    def observation_space(self, params):
        if self.observation in MAP_OBSERVATIONS:
            channels = (MAP_CHANNELS + PRIORITY_CHANNELS * (self.observation in PRIORITY_OBSERVATIONS)
                        + (self.observation in NOISE_OBSERVATIONS) + RANK_CHANNELS * (self.observation == "map_rank")
                        + CORRIDOR_CHANNELS * (self.observation == "map_corridor"))
            return spaces.Box(-1.0, 1.0, params.blocked.shape[1:] + (channels + 1,), jnp.float32)
        window = 2 * self.obs_radius + 1
        if self.observation == "local_path":
            return spaces.Box(-1.0, 1.0, (window, window, 4), jnp.float32)
        return spaces.Box(0, 1, (window, window, 3), jnp.uint8)

    def action_space(self, params):
        return spaces.Discrete(len(MOVES))

    def world_state_space(self, params):
        return spaces.Box(0.0, 1.0, params.blocked.shape[1:] + (4,), jnp.float32)

    def alive(self, state: MapfState, params) -> jax.Array:
        return state.active

    def observations_of(self, state: MapfState, params: MapfParams) -> jax.Array | None:
        """The returned state's observations; None (select between the stepped and the fresh episode's) when
        the pool stores its initial observations, so that only the stepped state is observed."""
        return None if params.initial_observations is not None else self.observations(state, params)


# -- movement ------------------------------------------------------------------------------------------


def targets_of(blocked, size, positions, actions):
    """(wanted cells ``[N, 2]``, whether each is inside the map and free)."""
    wanted = positions + jnp.asarray(MOVES)[actions]
    inside = jnp.all((wanted >= 0) & (wanted < size), axis=-1)
    safe = jnp.clip(wanted, 0, jnp.asarray(blocked.shape) - 1)
    return wanted, inside & ~blocked[safe[:, 0], safe[:, 1]]


def move(collision_system: str, blocked, size, positions, actions, active):
    """New positions ``[N, 2]`` after one joint move; inactive agents neither move nor block."""
    wanted, valid = targets_of(blocked, size, positions, actions)
    moving = active & (actions != 0) & valid
    if collision_system == "soft":
        stays = soft_stays(blocked.shape, positions, wanted, moving, active)
    elif collision_system == "block_both":
        stays = block_both_stays(blocked.shape, positions, wanted, moving, active)
    else:
        return priority_move(blocked.shape, positions, wanted, moving, active)
    return jnp.where(stays[:, None], positions, wanted)


def cell_ids(cells, shape):
    return cells[:, 0] * shape[1] + cells[:, 1]


def occupant_grid(shape, positions, active):
    """``int32[H * W]``: the index of the active agent on each cell, -1 where none."""
    n = positions.shape[0]
    ids = jnp.where(active, cell_ids(positions, shape), shape[0] * shape[1])  # inactive: dropped
    return jnp.full(shape[0] * shape[1], -1, jnp.int32).at[ids].set(jnp.arange(n, dtype=jnp.int32), mode="drop")


def soft_stays(shape, positions, wanted, moving, active):
    """Who waits under ``soft`` collisions: swaps refused, then contested cells resolved until stable."""
    n = positions.shape[0]
    cells = shape[0] * shape[1]
    index = jnp.arange(n, dtype=jnp.int32)
    occupant = occupant_grid(shape, positions, active)
    here, there = cell_ids(positions, shape), cell_ids(wanted, shape)
    other = jnp.where(moving, occupant[jnp.where(moving, there, 0)], -1)
    swap = moving & (other >= 0) & moving[other] & (there[other] == here)
    stays = ~moving | swap

    def resolve(carry):
        stays, _ = carry
        dest = jnp.where(active, jnp.where(stays, here, there), cells)  # inactive agents claim nothing
        stayer = jnp.zeros(cells + 1, bool).at[dest].max(stays & active)
        lowest = jnp.full(cells + 1, n, jnp.int32).at[dest].min(index)
        lost = active & ~stays & (stayer[dest] | (lowest[dest] != index))
        return stays | lost, jnp.any(lost)

    stays, _ = jax.lax.while_loop(lambda carry: carry[1], resolve, (stays, jnp.asarray(True)))
    return stays


def block_both_stays(shape, positions, wanted, moving, active):
    """Who waits under ``block_both``: a target occupied at the start, or wanted by another agent, blocks."""
    cells = shape[0] * shape[1]
    occupant = occupant_grid(shape, positions, active)
    there = jnp.where(moving, cell_ids(wanted, shape), cells)  # waiting agents are covered by the occupancy
    claims = jnp.zeros(cells + 1, jnp.int32).at[there].add(1)
    free = occupant[jnp.minimum(there, cells - 1)] < 0
    return ~(moving & free & (claims[there] == 1))


def priority_move(shape, positions, wanted, moving, active):
    """``priority``: agents in index order, each into its target if no active agent stands there now."""
    occupied = jnp.zeros(shape, bool).at[positions[:, 0], positions[:, 1]].max(active)

    def one(occupied, agent):
        position, target, go = agent
        go = go & ~occupied[target[0], target[1]]
        new = jnp.where(go, target, position)
        occupied = occupied.at[position[0], position[1]].set(occupied[position[0], position[1]] & ~go)
        occupied = occupied.at[new[0], new[1]].max(go)
        return occupied, new

    _, positions = jax.lax.scan(one, occupied, (positions, wanted, moving))
    return positions


# -- grids ------------------------------------------------------------------------------------------


def pogema_padding(blocked, size, radius: int):
    """The map as observations see it: ``[H + 2R, W + 2R]``, a ring of obstacles around the map's true
    ``size`` and free cells beyond it (as POGEMA pads)."""
    height, width = blocked.shape
    rows = jnp.arange(height + 2 * radius)[:, None] - radius
    cols = jnp.arange(width + 2 * radius)[None, :] - radius
    inside = (rows >= 0) & (rows < size[0]) & (cols >= 0) & (cols < size[1])
    ring = (rows >= -1) & (rows <= size[0]) & (cols >= -1) & (cols <= size[1]) & ~inside
    padded_map = jnp.pad(blocked, radius, constant_values=True)
    return jnp.where(inside, padded_map, ring)


def random_cell_in_component(key, components, position):
    """A uniformly random cell of ``position``'s component other than ``position`` (itself if it is alone)."""
    label = components[position[0], position[1]]
    flat = components.reshape(-1)
    here = position[0] * components.shape[1] + position[1]
    allowed = (flat == label) & (jnp.arange(flat.size) != here)
    choice = jax.random.categorical(key, jnp.where(allowed, 0.0, -jnp.inf))
    choice = jnp.where(jnp.any(allowed), choice, here)
    return jnp.stack([choice // components.shape[1], choice % components.shape[1]]).astype(jnp.int32)


def distance_fields(blocked, goals, size) -> jax.Array:
    """``int32[N, H, W]``: shortest-path distance from every cell to each goal (breadth-first, in JAX).

    Unreachable and blocked cells get ``H * W``. Iterates relaxations until no
    distance changes (as many as the longest shortest path).
    """
    height, width = blocked.shape
    far = height * width
    rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
    walls = blocked | (rows >= size[0]) | (cols >= size[1])

    def one(goal):
        start = jnp.full((height, width), far, jnp.int32).at[goal[0], goal[1]].set(0)

        def relax(carry):
            dist, _ = carry
            padded = jnp.pad(dist, 1, constant_values=far)
            neighbour = jnp.minimum(jnp.minimum(padded[:-2, 1:-1], padded[2:, 1:-1]),
                                    jnp.minimum(padded[1:-1, :-2], padded[1:-1, 2:]))
            new = jnp.where(walls, far, jnp.minimum(dist, neighbour + 1))
            return new, jnp.any(new != dist)

        dist, _ = jax.lax.while_loop(lambda carry: carry[1], relax, (start, jnp.asarray(True)))
        return dist

    return jax.vmap(one)(goals)


def shortest_path_actions(distances, positions) -> jax.Array:
    """``int32[N]``: for each agent, a move (1-4) that lowers its distance to the goal, 0 if none does."""
    height, width = distances.shape[1:]

    def one(dist, position):
        cells = position + jnp.asarray(MOVES)
        inside = jnp.all((cells >= 0) & (cells < jnp.array([height, width])), axis=-1)
        safe = jnp.clip(cells, 0, jnp.array([height, width]) - 1)
        values = jnp.where(inside, dist[safe[:, 0], safe[:, 1]], height * width + 1)
        best = jnp.argmin(values)
        return jnp.where(values[best] < values[0], best, 0).astype(jnp.int32)

    return jax.vmap(one)(distances, positions)



def deferred_distances(distances, pockets) -> jax.Array:
    """``int32[N, H, W]``: what deferred agents plan by, as ``experts.deferred_distances`` (in JAX, with the
    pool's ``H * W`` as the penalty): every cell of an agent's pocket leads out of it."""
    size = distances.shape[1] * distances.shape[2]
    way = pockets == POCKET_WAY
    exit_distance = jnp.max(jnp.where(way, distances, -1), axis=(1, 2), keepdims=True) + 1
    return jnp.where(pockets == POCKET_INNER, 2 * size + distances,
                     jnp.where(way, size + exit_distance - distances, distances))


def routed_distances(blocked, goals, size, distances, resting) -> jax.Array:
    """``int32[N, H, W]``: what agents off their goals plan by in ``map_route``, as ``experts.routed_distances``
    (in JAX): the distance to each goal around the ``resting`` cells, or ``distances`` plus ``ROUTE_PENALTY``."""
    return jnp.minimum(distance_fields(blocked | resting, goals, size), distances + ROUTE_PENALTY)


def goal_pockets(blocked, goals, size) -> jax.Array:
    """``int8[N, H, W]``: each goal's pocket, as ``experts.goal_pocket`` computes it on the host (in JAX).

    ``POCKET_INNER`` on the free cells that reach the rest of the map only
    through the goal (every region around it cut off by removing it, except
    the largest; equal sizes go to the region holding the first cell in
    row-major order), ``POCKET_WAY`` on the goal and the corridor leading to it
    from outside, 0 elsewhere, and all 0 when the goal cuts nothing off.
    """
    height, width = blocked.shape
    rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
    free = ~(blocked | (rows >= size[0]) | (cols >= size[1]))
    cells = jnp.arange(height * width, dtype=jnp.int32).reshape(height, width)
    none = height * width
    padded_free = jnp.pad(free, 1)

    def around(grid, fill):
        """The four neighbours' values of every cell (up, down, left, right), ``fill`` off the map."""
        padded = jnp.pad(grid, 1, constant_values=fill)
        return jnp.stack([padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]])

    degree = jnp.sum(around(free, False), axis=0)  # free neighbours of each cell

    def one(goal):
        open_ = free.at[goal[0], goal[1]].set(False)
        start = jnp.where(open_, cells, none)

        def spread(carry):
            label, _ = carry
            new = jnp.where(open_, jnp.minimum(label, jnp.min(around(label, none), axis=0)), none)
            return new, jnp.any(new != label)

        label, _ = jax.lax.while_loop(lambda carry: carry[1], spread, (start, jnp.asarray(True)))
        sizes = jnp.zeros(none + 1, jnp.int32).at[label.ravel()].add(1)
        near = jnp.stack([padded_free[goal[0] + 1 + dr, goal[1] + 1 + dc] for dr, dc in MOVES[1:]])
        near_label = jnp.stack([label[jnp.clip(goal[0] + dr, 0, height - 1), jnp.clip(goal[1] + dc, 0, width - 1)]
                                for dr, dc in MOVES[1:]])
        near_label = jnp.where(near, near_label, none)
        rank = jnp.where(near, sizes[near_label] * (none + 1) - near_label, -1)
        main = near_label[jnp.argmax(rank)]
        inner = open_ & jnp.any(label[None] == jnp.where(near_label == main, none, near_label)[:, None, None], 0)
        pocket = jnp.where(inner, POCKET_INNER, 0).astype(jnp.int8)
        any_inner = jnp.any(inner)
        pocket = pocket.at[goal[0], goal[1]].set(jnp.where(any_inner, POCKET_WAY, 0).astype(jnp.int8))
        entries = near & (near_label == main)
        entry = jnp.asarray(MOVES[1:])[jnp.argmax(entries)] + goal

        def walk(carry):
            pocket, behind, front, _ = carry
            ahead = degree[front[0], front[1]] - 1  # free neighbours of ``front`` besides ``behind``
            corridor = (ahead == 1) & (pocket[front[0], front[1]] == 0)
            pocket = pocket.at[front[0], front[1]].set(jnp.where(corridor, POCKET_WAY, pocket[front[0], front[1]]))
            steps = jnp.asarray(MOVES[1:]) + front
            inside = jnp.all((steps >= 0) & (steps < jnp.array([height, width])), -1)
            safe = jnp.clip(steps, 0, jnp.array([height - 1, width - 1]))
            onward = inside & free[safe[:, 0], safe[:, 1]] & jnp.any(steps != behind, -1)
            return pocket, front, safe[jnp.argmax(onward)], corridor

        going = any_inner & (jnp.sum(entries) == 1)
        pocket, *_ = jax.lax.while_loop(lambda carry: carry[3], walk, (pocket, goal, entry, going))
        return pocket

    return jax.vmap(one)(goals)


def dead_end_planes(blocked) -> jax.Array:
    """``float32[H, W, 4]``: per move (up, down, left, right), 1 on a free cell whose neighbour that way is
    free and from which the corridor leading away from that neighbour ends in a dead end (or closes on
    itself) before any junction: where PIBT's swap operation (``experts.ways_on``) finds
    that an agent cannot be pushed back and must be pulled out instead. 0 elsewhere.

    A fixed point over directed cells: leaving cell ``c`` away from its neighbour ``b``, the other free
    neighbours of ``c`` decide (none: a dead end; two or more: a junction) unless there is exactly one,
    ``c'``, in which case the answer is that of leaving ``c'`` away from ``c``. Corridors resolve one cell
    per iteration; rings never resolve and count as dead ends, as ``ways_on`` counts them.
    """
    free = ~blocked
    padded = jnp.pad(free, 1)
    height, width = blocked.shape
    offsets = MOVES[1:]  # up, down, left, right
    opposite = jnp.array([1, 0, 3, 2])
    neighbour_free = jnp.stack([padded[1 + dr:1 + dr + height, 1 + dc:1 + dc + width] for dr, dc in offsets])
    # others[d, e]: leaving a cell away from its neighbour d, is the neighbour e another way on?
    others = neighbour_free[None] & (jnp.arange(4)[:, None] != jnp.arange(4)[None, :])[..., None, None]
    count = jnp.sum(others, axis=1)                   # [d, H, W]
    onward = jnp.argmax(others, axis=1)               # [d, H, W]: the way on when there is one
    rows, cols = jnp.meshgrid(jnp.arange(height), jnp.arange(width), indexing="ij")
    next_rows = jnp.clip(rows + jnp.asarray(offsets[:, 0])[onward], 0, height - 1)
    next_cols = jnp.clip(cols + jnp.asarray(offsets[:, 1])[onward], 0, width - 1)
    came_from = opposite[onward]                      # leaving the next cell away from this one
    DEAD, JUNCTION, OPEN = 0, 1, 2
    known = jnp.where(count == 0, DEAD, jnp.where(count >= 2, JUNCTION, OPEN))

    def follow(carry):
        answer, _, steps = carry
        ahead = answer[came_from, next_rows, next_cols]
        updated = jnp.where(known == OPEN, ahead, answer)
        return updated, jnp.any(updated != answer), steps + 1

    answer, _, _ = jax.lax.while_loop(lambda carry: carry[1] & (carry[2] < height * width), follow,
                                      (known, jnp.array(True), jnp.array(0)))
    dead = (answer != JUNCTION) & neighbour_free & free[None]
    return jnp.moveaxis(dead, 0, -1).astype(jnp.float32)
