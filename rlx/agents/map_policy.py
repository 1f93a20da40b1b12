"""A centralized, map-based MAPF policy trained by imitation, as pure jittable functions in one file.

Vendorable: this file imports only jax, flax, optax and numpy. Copy it into
your project and run ``python map_policy.py`` to train it on a built-in toy
task (open grid, a scripted expert).

The policy is a fully convolutional network over whole-map feature planes
(in the spirit of RAILGUN, IROS 2025): it outputs 5 action logits for every
cell, and each agent takes the action of the cell it stands on. One model
therefore serves any map size and any number of agents; conflicts between the
chosen moves are left to the environment's collision rules.

Agents sampling at once cannot coordinate: two agents that each move half the
time collide or both wait as often as one of them goes. With
``decode_rounds=K`` they decide in K rounds instead (in the spirit of MaskGIT's
iterative decoding): each round every undecided agent samples a move, the most
confident ones (a growing share, all of them by the last round) keep theirs, and
the next rounds see the kept moves as extra input planes (each decided agent's
action, one-hot, on its cell). Training shows the network a random share of
agents already decided on the expert's actions and scores only the others.

With ``message_heads=H``, agents also exchange one round of messages mid-network (``AgentMessages``: H
attention heads over all active agents, scored and heard with their offsets), so that agents further apart
than the convolutions' view can still inform each other. rlx's MAPF study measured it: a better fit, no
better policy after DAgger.

With ``augment``, each training sample is first turned or mirrored by one of the
square's 8 symmetries, drawn at random (planes, agent cells and action labels
alike), so that a pool of M maps teaches as 8M would: a map's rules and an
expert like PIBT treat every direction alike. Needs square maps and, for
per-move input planes, the environment's ``move_planes``. It helps a network
that overfits its maps; rlx's MAPF study measured one that does not (no gain).

Training is behaviour cloning of an expert's joint actions (e.g. PIBT): each
update draws ``num_envs`` instances from the environment's pool, replays the
expert's actions there for ``num_steps`` steps (so the states are the
expert's), samples ``samples_per_episode`` of those steps and takes one Adam
step on the cross-entropy of the expert's action at every active agent's cell.
``train_return`` in the metrics is the imitation accuracy (the share of agent
moves that match the expert); the rlx runner's evaluation reports the real
task return (success rate in POGEMA's ``nothing`` mode).

The environment must offer (rlx's ``MapfEnv`` with ``observation="map"`` does):

* ``env.num_agents``; ``env.reset_to(instance, key, params) -> (obs, state)`` and
  ``env.step_env(key, state, actions, params) -> (obs, state, rewards, terminated, info)``
  without auto-reset; observations ``[n, H, W, C + 1]``: C feature planes shared by
  every agent, then a plane that is 1 on the agent's own cell (all 0 once it is done);
* ``params.expert_actions`` ``int[M, T, n]`` for the ``M`` instances of its pool;
  optionally ``params.behaviour_actions`` (same shape, or None): the actions replayed to reach
  the states, when they are not the expert's. DAgger (Ross et al., 2011) uses it: a pool entry
  then holds the learner's own episode and, as labels, the expert's action in each of its states.
  A label of -1 marks an agent's step the expert was not asked about (a costly expert labels a few
  steps of each episode; a focused round labels only the agents it is about): the loss only samples
  steps with some label and scores only the labelled agents.
* optionally ``params.committed_actions`` (``int8[M, T, n]``, -1 for none, or None): DAgger's record of
  the learner's own earlier decoding rounds, the action each agent had committed to when the expert labelled
  the others around those moves. A sampled step with a record shows those commitments (as the committed-action
  planes) instead of a random share of the expert's own moves: the learner's rounds commit its moves, not
  the expert's, and this teaches it how to go on from them.
* optionally ``env.observations(state, params)``: a state's observations, as ``reset_to`` and ``step_env``
  return them. Training then observes only the steps it samples, not every step it replays.
* for ``augment``: ``env.move_planes``, the first channel of each group of 4 feature planes that hold
  one value per move (up, down, left, right), which a symmetry reorders (``()`` if none).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

NUM_ACTIONS = 5  # wait, up, down, left, right
MOVES = np.array([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])  # (row, column) step of each action


def static(default):
    """A dataclass field that shapes the program instead of being a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """Imitation hyper-parameters; ``static`` fields decide shapes and program structure."""

    lr: float = 1e-3
    max_grad_norm: float = 1.0
    weight_decay: float = 1e-4
    total_timesteps: int = static(1_048_576)  # expert steps replayed (num_envs x num_steps per update)
    num_envs: int = static(16)  # instances per update
    num_steps: int = static(128)  # expert steps replayed per instance
    samples_per_episode: int = static(8)  # of those, steps in the loss
    channels: tuple = static((32, 32, 32, 32, 32, 32))  # one 3x3 convolution per entry
    decode_rounds: int = static(1)  # 1: agents choose independently; K > 1: in K rounds, each seeing earlier choices
    anneal_lr: bool = static(True)
    augment: bool = static(False)  # each sample seen in one of the square's 8 symmetries, drawn at random
    message_heads: int = static(0)  # > 0: agents exchange one round of messages (attention heads) mid-network

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


def with_decode_rounds(config: Config, rounds: int) -> Config:
    """``config`` deciding in ``rounds`` rounds. Training reads the count only as "more than one", so a
    trained policy may decode in any number of rounds; a one-round config stays one (its network has no
    committed-action planes)."""
    return config.replace(decode_rounds=rounds) if config.decode_rounds > 1 else config


def validate_for_env(config: Config, env, env_params) -> None:
    """The check that needs the environment: whole-map observations (``env.reset_to``) and a pool of the
    expert's joint actions to imitate (``env_params.expert_actions``), as the MAPF environments give."""
    if not hasattr(env, "reset_to") or getattr(env_params, "expert_actions", None) is None:
        raise ValueError(f"name=map_policy: imitates an expert over whole-map planes; {type(env).__name__} has "
                         "no expert pool (env_params.expert_actions) or reset_to (the mapf_* environments do)")


def validate(config: Config) -> None:
    """Raise ``ValueError("field=value: rule")`` for the first invalid field, before tracing."""
    rules = [
        ("lr", config.lr > 0, "must be > 0"),
        ("max_grad_norm", config.max_grad_norm > 0, "must be > 0"),
        ("weight_decay", config.weight_decay >= 0, "must be >= 0"),
        ("num_envs", config.num_envs >= 1, "must be >= 1"),
        ("num_steps", config.num_steps >= 1, "must be >= 1"),
        ("samples_per_episode", 1 <= config.samples_per_episode <= config.num_steps, "must be in [1, num_steps]"),
        ("decode_rounds", config.decode_rounds >= 1, "must be >= 1"),
        ("message_heads", config.message_heads >= 0, "must be >= 0 (0: no messages between agents)"),
        ("channels", len(config.channels) >= 1
         and all(isinstance(c, (int, np.integer)) and c >= 1 for c in config.channels),
         "needs at least one layer, every width an integer >= 1"),
        ("total_timesteps", config.batch_size >= 1 and config.num_updates >= 1,
         f"must be >= one batch ({config.batch_size})"),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


# --------------------------------------------------------------------------- the network


def neighbourhoods(x):
    """``[..., H, W, C] -> [..., H, W, 9C]``: each cell's 3x3 neighbourhood (zeros beyond the map).

    A 3x3 convolution is then a dense layer on these: the same function as
    ``nn.Conv``, but XLA's CPU backend runs the matrix product much faster.
    """
    pad = [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    padded = jnp.pad(x, pad)
    height, width = x.shape[-3], x.shape[-2]
    shifts = [padded[..., r:r + height, c:c + width, :] for r in range(3) for c in range(3)]
    return jnp.concatenate(shifts, axis=-1)


def at_agent_cells(me, planes):
    """``[..., n, C]``: each agent's values of ``planes [..., H, W, C]`` at its own cell (``me [..., n, H, W]``
    is 1 there; zeros for an agent without a cell)."""
    return jnp.einsum("...nhw,...hwc->...nc", me, planes)


def on_agent_cells(me, values):
    """``[..., H, W, C]``: each agent's ``values [..., n, C]`` put on its own cell (zeros elsewhere)."""
    return jnp.einsum("...nhw,...nc->...hwc", me, values)


def agent_cells(me):
    """Each agent's (row, column) ``[..., n, 2]`` from its cell plane ``me [..., n, H, W]`` (0, 0 without one)."""
    rows = jnp.einsum("...nhw,h->...n", me, jnp.arange(me.shape[-2], dtype=me.dtype))
    cols = jnp.einsum("...nhw,w->...n", me, jnp.arange(me.shape[-1], dtype=me.dtype))
    return jnp.stack([rows, cols], -1)


class AgentMessages(nn.Module):
    """One round of messages between agents: each agent attends to every other active agent, wherever it is
    on the map. The features at an agent's cell are its query, key and value; each head's score adds a
    learned function of the two agents' offset, so near and far, ahead and behind, weigh differently. The
    message is added back on the agent's cell, for the next convolutions to spread. The convolutions alone
    link only agents within their receptive field, and only through the cells between them."""

    heads: int
    offset_scale: float = 8.0  # cells: offsets enter the score's network divided by this

    @nn.compact
    def __call__(self, x, me):
        width = x.shape[-1]
        head_width = max(width // self.heads, 1)
        mine = at_agent_cells(me, x)  # [..., n, C]
        active = jnp.sum(me, (-2, -1)) > 0
        cells = agent_cells(me)
        offset = cells[..., None, :, :] - cells[..., :, None, :]  # [..., i, j, 2]: j's cell - i's
        geometry = jnp.concatenate([offset, jnp.sum(jnp.abs(offset), -1, keepdims=True)], -1) / self.offset_scale
        where = nn.relu(nn.Dense(32)(geometry))  # [..., n, n, 32]: where each agent stands as seen from each
        bias = nn.Dense(self.heads)(where)
        split = lambda y: y.reshape(y.shape[:-1] + (self.heads, head_width))  # noqa: E731
        query, key, value = (split(nn.Dense(self.heads * head_width)(mine)) for _ in range(3))
        score = jnp.einsum("...ikd,...jkd->...ijk", query, key) / np.sqrt(head_width) + bias
        score = jnp.where(active[..., None, :, None], score, -1e9)
        weights = jax.nn.softmax(score, axis=-2)  # agent i's weights over the agents j it hears
        # what each head heard, and from where (a value alone says what an agent is, not where it stands)
        heard = jnp.einsum("...ijk,...jkd->...ikd", weights, value).reshape(mine.shape[:-1] + (-1,))
        heard_where = jnp.einsum("...ijk,...ijd->...ikd", weights, where).reshape(mine.shape[:-1] + (-1,))
        message = nn.Dense(width, kernel_init=nn.initializers.zeros)(jnp.concatenate([heard, heard_where], -1))
        message = message * active[..., None]
        return x + on_agent_cells(me, message)


class FullyConvolutional(nn.Module):
    """Per-cell action logits from whole-map planes: 3x3 convolutions (ReLU, residual where widths match);
    with ``message_heads``, one round of messages between agents (``AgentMessages``) after the middle layer."""

    channels: tuple
    message_heads: int = 0

    @nn.compact
    def __call__(self, planes, me=None):
        if self.message_heads and me is None:
            raise ValueError("FullyConvolutional: message_heads > 0 needs the agents' cell planes (me [..., n, H, W])")
        x = planes
        for layer, width in enumerate(self.channels):
            y = nn.relu(nn.Dense(width)(neighbourhoods(x)))
            x = x + y if x.shape[-1] == width else y
            if self.message_heads and layer == (len(self.channels) - 1) // 2:
                x = AgentMessages(self.message_heads)(x, me)
        return nn.Dense(NUM_ACTIONS, kernel_init=nn.initializers.orthogonal(0.01))(x)


def committed_planes(me, committed, actions):
    """``[..., H, W, 5]``: the one-hot action of each committed agent at its cell (zeros elsewhere)."""
    chosen = jax.nn.one_hot(actions, NUM_ACTIONS) * committed[..., None]
    return on_agent_cells(me, chosen)


def commit_most_confident(committed, sampled, actions, confidence, count):
    """Commit, among the uncommitted agents, the ``count`` (``[...]``) with the highest ``confidence``
    ``[..., n]`` to their ``sampled`` action; returns the new (committed, actions)."""
    score = jnp.where(committed, -jnp.inf, confidence)
    rank = jnp.argsort(jnp.argsort(-score, axis=-1), axis=-1)
    new = ~committed & (rank < count[..., None])
    return committed | new, jnp.where(new, sampled, actions)


# --------------------------------------------------------------------------- symmetries of the square


def symmetry_bits(symmetry):
    """``symmetry`` in [0, 8): (transpose, flip rows, flip columns), applied in that order."""
    return symmetry & 1, (symmetry >> 1) & 1, (symmetry >> 2) & 1


def map_cells(symmetry, rows, cols, size):
    """Where cells ``(rows, cols)`` of a ``size x size`` map go under ``symmetry``."""
    transpose, flip_rows, flip_cols = symmetry_bits(symmetry)
    rows, cols = jnp.where(transpose, cols, rows), jnp.where(transpose, rows, cols)
    return jnp.where(flip_rows, size - 1 - rows, rows), jnp.where(flip_cols, size - 1 - cols, cols)


def action_permutation(symmetry):
    """``int[5]``: the action that each action becomes under ``symmetry`` (wait stays wait)."""
    moves = jnp.asarray(MOVES)
    rows, cols = map_cells(symmetry, moves[:, 0], moves[:, 1], 1)  # a 1x1 map: flips negate the step
    turned = jnp.stack([rows, cols], -1)
    return jnp.argmax(jnp.all(turned[:, None] == moves[None], -1), -1)


def turn_actions(permutation, actions):
    """``actions`` (-1, unlabelled or uncommitted, stays -1) as ``permutation`` (``action_permutation``) turns them."""
    return jnp.where(actions >= 0, permutation[jnp.maximum(actions, 0)], actions)


def transform_sample(symmetry, planes, cells, actions, move_planes: tuple = ()):
    """One sample under ``symmetry``: shared planes ``[H, W, C]`` (H == W), agents' flat cell indices ``[n]`` and
    their actions ``[n]`` (-1, unlabelled, stays -1). Per-move channels (4 from each of ``move_planes``) swap
    as their moves do."""
    size = planes.shape[0]
    to_rows, to_cols = map_cells(symmetry, *jnp.divmod(jnp.arange(size * size), size), size)
    flat = planes.reshape(size * size, -1)
    planes = jnp.zeros_like(flat).at[to_rows * size + to_cols].set(flat).reshape(planes.shape)
    permutation = action_permutation(symmetry)
    for first in move_planes:  # the plane of move a goes where the plane of the move it becomes was
        planes = planes.at[..., first + permutation[1:] - 1].set(planes[..., first:first + 4])
    cell_rows, cell_cols = map_cells(symmetry, cells // size, cells % size, size)
    actions = turn_actions(permutation, actions)
    return planes, (cell_rows * size + cell_cols).astype(cells.dtype), actions.astype(jnp.int32)


def with_recorded_commits(batch, committed, fixed):
    """Training samples whose earlier decoding rounds were recorded (``fixed [S, n]``: the action each agent
    had committed to, -1 for none; the labels of the others answer those commitments) keep that commitment
    instead of the random one; samples with no record keep ``committed``. Returns (batch, committed)."""
    planes, cells, active, actions = batch
    has_record = jnp.any(fixed >= 0, -1, keepdims=True)
    committed = jnp.where(has_record, active & (fixed >= 0), committed)
    actions = jnp.where(fixed >= 0, fixed, actions)
    return (planes, cells, active, actions), committed


def steps_worth_a_loss(labels):
    """``bool[E, T]``: the steps of episodes with expert actions ``labels [E, T, n]`` (-1: unlabelled, 0: wait)
    that training samples: some agent labelled, up to the last step in which the expert still moves (the
    first step when it never moves)."""
    steps = jnp.arange(labels.shape[1])
    labelled = jnp.any(labels >= 0, axis=-1)
    moving = jnp.any(labels > 0, axis=-1)
    lengths = jnp.max(jnp.where(moving, steps[None] + 1, 0), axis=1)
    worth = labelled & (steps[None] < jnp.maximum(lengths, 1)[:, None])
    return worth.at[:, 0].set(worth[:, 0] | ~jnp.any(worth, axis=1))


def agent_logits(cell_logits, me):
    """Each agent's logits ``[..., n, 5]``: the cell logits ``[..., H, W, 5]`` at its own cell
    (``me`` ``[..., n, H, W]`` is 1 there)."""
    return at_agent_cells(me, cell_logits)


# --------------------------------------------------------------------------- state and agent


class Policy(NamedTuple):
    params: Any


class TrainState(struct.PyTreeNode):
    params: Any
    opt_state: Any
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array

    @property
    def policy(self) -> Policy:
        return Policy(self.params)


class Agent(NamedTuple):
    init: Callable  # key -> TrainState
    update: Callable  # TrainState -> (TrainState, metrics)
    act: Callable  # (Policy, obs [..., n, H, W, C + 1], key, greedy, mask=None) -> actions [..., n]
    replay: Callable  # (instance, key) -> expert episode (planes, agent cells, active, actions)
    logits: Callable  # (Policy, obs [..., n, H, W, C + 1]) -> each agent's action logits [..., n, 5]
    decode: Callable  # act's arguments -> (actions [..., n], the decoding round in which each agent chose [..., n])


def make(config: Config, env, env_params) -> Agent:
    """Build the imitation learner's pure functions for one environment and its expert pool."""
    network = FullyConvolutional(tuple(int(c) for c in config.channels), int(config.message_heads))
    expert = jnp.asarray(env_params.expert_actions)
    behaviour = getattr(env_params, "behaviour_actions", None)
    behaviour = expert if behaviour is None else jnp.asarray(behaviour)
    pool_size, horizon = expert.shape[0], expert.shape[1]
    steps = min(config.num_steps, horizon)
    obs_spec, _ = jax.eval_shape(lambda k: env.reset_to(0, k, env_params), jax.random.PRNGKey(0))
    features = obs_spec.shape[-1] - 1
    if config.augment:
        if obs_spec.shape[-3] != obs_spec.shape[-2]:
            raise ValueError(f"augment=True: needs square maps, got {obs_spec.shape[-3]}x{obs_spec.shape[-2]}")
        if not hasattr(env, "move_planes"):
            raise ValueError("augment=True: the environment must say which planes are per move (env.move_planes, "
                             "() if none)")
        move_planes = tuple(int(c) for c in env.move_planes)
        turn = jax.vmap(lambda s, p, c, a: transform_sample(s, p, c, a, move_planes))

    def learning_rate(count):  # annealed linearly to 0 over the run, and 0 past its end
        return config.lr * jnp.maximum(1.0 - count / config.num_updates, 0.0) if config.anneal_lr else config.lr

    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(learning_rate, weight_decay=config.weight_decay),
    )

    rounds = config.decode_rounds
    extra = NUM_ACTIONS if rounds > 1 else 0  # committed-action planes in the input
    recorded = getattr(env_params, "committed_actions", None)
    recorded = None if recorded is None else jnp.asarray(recorded)
    if recorded is not None and rounds == 1:
        raise ValueError("env_params.committed_actions: recorded decoding rounds need decode_rounds > 1")

    def cell_logits_of(params, planes, me, committed, actions):
        if rounds > 1:
            planes = jnp.concatenate([planes, committed_planes(me, committed, actions)], -1)
        return network.apply(params, planes, me)

    def logits_of(policy: Policy, obs):
        """Each agent's logits with no choice made yet (the first decoding round)."""
        planes, me = obs[..., 0, :, :, :features], obs[..., features]
        nobody = jnp.zeros(me.shape[:-2], bool)
        return agent_logits(cell_logits_of(policy.params, planes, me, nobody, nobody.astype(jnp.int32)), me)

    def decode(policy: Policy, obs, key, greedy: bool = False, mask=None):
        """Sample every agent's action; with ``decode_rounds`` K > 1, in K rounds, each round fixing the
        most confident share of the undecided agents, whose choices the next rounds see in their input.
        Returns the actions ``[..., n]`` and the round in which each agent decided ``[..., n]`` (-1: no cell)."""
        planes, me = obs[..., 0, :, :, :features], obs[..., features]
        active = jnp.sum(me, (-2, -1)) > 0
        committed, actions = ~active, jnp.zeros(active.shape, jnp.int32)  # agents without a cell: nothing to do
        decided_in = jnp.full(active.shape, -1, jnp.int32)
        sample_keys = jax.random.split(key, rounds) if rounds > 1 else key[None]  # one round: the key as given

        def decide_round(carry, round_and_key):
            committed, actions, decided_in = carry
            k, sample_key = round_and_key
            logits = agent_logits(cell_logits_of(policy.params, planes, me, committed, actions), me)
            if mask is not None:
                logits = jnp.where(mask, logits, -1e9)
            sampled = jnp.where(greedy, jnp.argmax(logits, -1), jax.random.categorical(sample_key, logits))
            sampled = sampled.astype(jnp.int32)
            confidence = jnp.take_along_axis(jax.nn.log_softmax(logits), sampled[..., None], -1)[..., 0]
            target = -(-jnp.sum(active, -1) * (k + 1) // rounds)  # ceil: all of them after the last round
            count = target - jnp.sum(committed & active, -1)
            now, actions = commit_most_confident(committed, sampled, actions, confidence, count)
            decided_in = jnp.where(now & ~committed, k, decided_in)
            return (now, actions, decided_in), None

        # a loop, not K unrolled copies of the network: tracing and compiling cost one round, whatever K
        (_, actions, decided_in), _ = jax.lax.scan(decide_round, (committed, actions, decided_in),
                                                   (jnp.arange(rounds), sample_keys))
        return actions, decided_in

    def act(policy: Policy, obs, key, greedy: bool = False, mask=None):
        """``decode``'s actions."""
        return decode(policy, obs, key, greedy, mask)[0]

    def init(key) -> TrainState:
        net_key, key = jax.random.split(key)
        params = network.init(net_key, jnp.zeros(obs_spec.shape[1:-1] + (features + extra,)),
                              jnp.zeros(obs_spec.shape[:-1]))
        return TrainState(params=params, opt_state=optimizer.init(params), key=key,
                          update_step=jnp.asarray(0, jnp.int32), env_steps=jnp.asarray(0, jnp.int32))

    def sample_of(obs):
        """What training keeps of one step's observations: the shared planes ``[H, W, C]``, each agent's cell
        index ``[n]`` and whether it is active ``[n]``."""
        me = obs[..., features].reshape(obs.shape[0], -1)
        return obs[0, ..., :features], jnp.argmax(me, -1), jnp.max(me, -1) > 0

    def replay_states(instance, key):
        """The episode on pool entry ``instance`` (the expert's, or the ``behaviour_actions``): the
        environment state before each step ``[T, ...]`` and the expert's action there ``[T, n]``."""
        reset_key, key = jax.random.split(key)
        _, env_state = env.reset_to(instance, reset_key, env_params)

        def step(carry, t):
            env_state, key = carry
            key, step_key = jax.random.split(key)
            _, next_state, *_ = env.step_env(step_key, env_state, behaviour[instance, t], env_params)
            return (next_state, key), (env_state, expert[instance, t])

        return jax.lax.scan(step, (env_state, key), jnp.arange(steps))[1]

    observe = getattr(env, "observations", None)
    samples_of_states = jax.vmap(lambda state: sample_of(observe(state, env_params)))

    def replay(instance, key):
        """``replay_states``' episode as training samples: per step the shared planes ``[T, H, W, C]``, each
        agent's cell index ``[T, n]``, whether it is active ``[T, n]`` and its expert action ``[T, n]``."""
        states, actions = replay_states(instance, key)
        return (*samples_of_states(states), actions)

    def sampled_steps(instances, key, picks):
        """``(planes, cells, active, actions)`` of steps ``picks [E, S]`` of the episodes on ``instances [E]``.
        With ``env.observations``, only the picked steps are observed (a costly observation, such as one
        that searches the map every step, then costs S instead of T per episode)."""
        keys = jax.random.split(key, instances.shape[0])
        take = lambda x: jnp.take_along_axis(  # noqa: E731
            x, picks.reshape(picks.shape + (1,) * (x.ndim - 2)), axis=1).reshape((-1,) + x.shape[2:])
        if observe is None:
            return tuple(map(take, jax.vmap(replay_obs)(instances, keys)))
        states, actions = jax.vmap(replay_states)(instances, keys)
        planes, cells, active = samples_of_states(jax.tree.map(take, states))
        return planes, cells, active, take(actions)

    def replay_obs(instance, key):
        """``replay`` for environments without ``observations``: each step's observations as it returns them."""
        reset_key, key = jax.random.split(key)
        obs, env_state = env.reset_to(instance, reset_key, env_params)

        def step(carry, t):
            obs, env_state, key = carry
            key, step_key = jax.random.split(key)
            record = (*sample_of(obs), expert[instance, t])
            obs, env_state, *_ = env.step_env(step_key, env_state, behaviour[instance, t], env_params)
            return (obs, env_state, key), record

        return jax.lax.scan(step, (obs, env_state, key), jnp.arange(steps))[1]

    def loss_fn(params, planes, cells, active, actions, committed):
        """Cross-entropy of the expert's action of every active agent not already committed to it."""
        height, width = planes.shape[-3], planes.shape[-2]
        me = (jax.nn.one_hot(cells, height * width) * active[..., None]).reshape(cells.shape + (height, width))
        cell_logits = cell_logits_of(params, planes, me, committed, actions)  # [S, H, W, 5]
        flat = cell_logits.reshape(cell_logits.shape[0], -1, NUM_ACTIONS)
        logits = jnp.take_along_axis(flat, cells[..., None], axis=1)  # [S, n, 5]
        log_p = jax.nn.log_softmax(logits)
        chosen = jnp.take_along_axis(log_p, jnp.maximum(actions, 0)[..., None].astype(jnp.int32), -1)[..., 0]
        weight = (active & ~committed & (actions >= 0)).astype(jnp.float32)
        loss = -jnp.sum(chosen * weight) / jnp.maximum(weight.sum(), 1.0)
        accuracy = jnp.sum((jnp.argmax(logits, -1) == actions) * weight) / jnp.maximum(weight.sum(), 1.0)
        return loss, accuracy

    def commit_at_random(key, active, actions):
        """Training's stand-in for earlier decoding rounds: each sample commits a uniformly random share of
        its agents to the expert's actions (none when ``decode_rounds`` is 1)."""
        if rounds == 1:
            return jnp.zeros_like(active)
        share_key, agent_key = jax.random.split(key)
        share = jax.random.uniform(share_key, active.shape[:1] + (1,))
        return active & (jax.random.uniform(agent_key, active.shape) < share) & (actions >= 0)

    def update(state: TrainState):
        key, pick_key, replay_key, sample_key = jax.random.split(state.key, 4)
        instances = jax.random.randint(pick_key, (config.num_envs,), 0, pool_size)
        # computed for the sampled episodes only: over the whole pool, a constant of the program, XLA would
        # fold it at every compile
        worth = steps_worth_a_loss(expert[instances, :steps])
        picks = jax.random.categorical(sample_key, jnp.where(worth, 0.0, -jnp.inf)[:, None],
                                       shape=(config.num_envs, config.samples_per_episode))
        batch = sampled_steps(instances, replay_key, picks)
        if config.augment:
            symmetries = jax.random.randint(jax.random.fold_in(sample_key, 2), batch[1].shape[:1], 0, 8)
            turned_planes, turned_cells, turned_actions = turn(symmetries, batch[0], batch[1], batch[3])
            batch = (turned_planes, turned_cells, batch[2], turned_actions)
        committed = commit_at_random(jax.random.fold_in(sample_key, 1), batch[2], batch[3])
        if recorded is not None:
            fixed = jnp.take_along_axis(recorded[instances], picks[..., None], axis=1)
            fixed = fixed.reshape((-1,) + fixed.shape[2:]).astype(jnp.int32)
            if config.augment:
                fixed = jax.vmap(turn_actions)(jax.vmap(action_permutation)(symmetries), fixed)
            batch, committed = with_recorded_commits(batch, committed, fixed)
        batch = (*batch, committed)
        (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, *batch)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        state = state.replace(params=params, opt_state=opt_state, key=key, update_step=state.update_step + 1,
                              env_steps=state.env_steps + config.num_envs * steps)
        return state, {"loss": loss, "train_return": accuracy, "grad_norm": optax.tree.norm(grads)}

    return Agent(init=init, update=update, act=act, replay=replay if observe else replay_obs, logits=logits_of,
                 decode=decode)


def train(config: Config, env, env_params, key, num_updates: int | None = None):
    """``init`` then ``num_updates`` updates under ``lax.scan``; returns (final state, stacked metrics)."""
    agent = make(config, env, env_params)
    return jax.lax.scan(lambda s, _: agent.update(s), agent.init(key), None, num_updates or config.num_updates)


# --------------------------------------------------------------------------- the command-line demo


@struct.dataclass
class ToyParams:
    starts: jax.Array  # [M, n, 2]
    goals: jax.Array  # [M, n, 2]
    expert_actions: jax.Array  # [M, T, n]


class ToyGrid:
    """Agents cross an open ``size x size`` grid; a move into another agent's cell or a contested cell
    (lowest index wins) is a wait. Map planes: agents, goals, and per agent which moves bring it closer."""

    moves = jnp.asarray(MOVES)

    def __init__(self, size: int = 6, num_agents: int = 4):
        self.size, self.num_agents = size, num_agents

    def planes(self, positions, goals):
        n, size = self.num_agents, self.size
        cells = jnp.zeros((size, size, 7)).at[positions[:, 0], positions[:, 1], 0].set(1.0)
        cells = cells.at[goals[:, 0], goals[:, 1], 1].set(1.0)
        before = jnp.abs(goals - positions).sum(-1)
        after = jnp.abs(goals[:, None] - jnp.clip(positions[:, None] + self.moves, 0, size - 1)).sum(-1)
        closer = jnp.sign(after - before[:, None]).astype(jnp.float32)  # [n, 5]
        me = jnp.zeros((n, size, size)).at[jnp.arange(n), positions[:, 0], positions[:, 1]].set(1.0)
        cells = cells.at[positions[:, 0], positions[:, 1], 2:].set(closer)
        return jnp.concatenate([jnp.broadcast_to(cells, (n,) + cells.shape), me[..., None]], -1)

    def observations(self, state, params):
        return self.planes(*state)

    def reset_to(self, instance, key, params):
        state = (params.starts[instance], params.goals[instance])
        return self.observations(state, params), state

    def step_env(self, key, state, actions, params):
        positions, goals = state
        wanted = jnp.clip(positions + self.moves[actions], 0, self.size - 1)
        taken = jnp.any(jnp.all(wanted[:, None] == positions[None], -1) & ~jnp.eye(self.num_agents, dtype=bool), 1)
        earlier = jnp.tril(jnp.all(wanted[:, None] == wanted[None], -1), -1)
        go = ~taken & ~jnp.any(earlier, 1)
        positions = jnp.where(go[:, None], wanted, positions)
        done = jnp.all(positions == goals, -1)
        return self.planes(positions, goals), (positions, goals), done.astype(jnp.float32), done, {}

    def expert(self, positions, goals):
        """Row first, then column, toward the goal (the environment resolves conflicts)."""
        dr, dc = goals[:, 0] - positions[:, 0], goals[:, 1] - positions[:, 1]
        return jnp.where(dr < 0, 1, jnp.where(dr > 0, 2, jnp.where(dc < 0, 3, jnp.where(dc > 0, 4, 0))))

    def pool(self, key, count: int, horizon: int) -> ToyParams:
        cells = self.size * self.size

        def one(key):
            start_key, goal_key = jax.random.split(key)
            pick = lambda k: jax.random.permutation(k, cells)[:self.num_agents]  # noqa: E731
            as_rc = lambda i: jnp.stack([i // self.size, i % self.size], -1)  # noqa: E731
            starts, goals = as_rc(pick(start_key)), as_rc(pick(goal_key))

            def step(positions, _):
                actions = self.expert(positions, goals)
                _, (positions, _), *_ = self.step_env(None, (positions, goals), actions, None)
                return positions, actions

            return starts, goals, jax.lax.scan(step, starts, None, horizon)[1]

        starts, goals, actions = jax.vmap(one)(jax.random.split(key, count))
        return ToyParams(starts, goals, actions)


def _cli():
    import argparse
    import os
    import time

    # Works around a hang of jaxlib 0.10's CPU runtime on some vmapped programs; added to any
    # XLA_FLAGS the user already set (unless they name the scheduler themselves).
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()
    parser = argparse.ArgumentParser(description="Imitate a scripted expert on a toy open-grid MAPF task.")
    parser.add_argument("--timesteps", type=int, default=20_480)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = ToyGrid()
    params = env.pool(jax.random.PRNGKey(args.seed + 1), 256, 16)
    config = Config(total_timesteps=args.timesteps, num_envs=16, num_steps=16, samples_per_episode=8,
                    channels=(32, 32, 32), lr=3e-3)
    validate(config)
    start = time.perf_counter()
    _, metrics = jax.jit(lambda k: train(config, env, params, k))(jax.random.PRNGKey(args.seed))
    accuracy = np.asarray(metrics["train_return"])
    step = max(1, len(accuracy) // 10)
    for i in range(step - 1, len(accuracy), step):
        print(f"update {i + 1:6d}  expert steps {(i + 1) * config.batch_size:8d}  imitation accuracy {accuracy[i]:.3f}")
    print(f"final train return {accuracy[-1]:.3f} (imitation accuracy; chance 0.2) in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    _cli()
