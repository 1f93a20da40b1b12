"""Multi-agent PPO (MAPPO, IPPO and a critic-free group-relative variant) as pure, jittable functions.

Vendorable: this file imports only jax, flax, optax and numpy. Copy it into
your project and run ``python mappo.py`` to train on the small cooperative game
defined at the bottom of the file.

Environments follow rlx's array-per-agent contract (duck-typed; the gymnax
1.0 calls with a leading agent axis): ``reset(key, params) -> (obs [n, ...],
state)``, ``step(key, state, actions [n], params) -> (obs, state, rewards [n],
terminated [n], truncated [n], info)`` with auto-reset and ``info`` holding
``final_observation``, ``final_world_state`` and ``episode_over``; plus
``world_state(state, params)``, ``num_agents``, ``action_space(params).n`` and,
optionally, ``action_mask(state, params) -> bool[n, num_actions]`` and
``alive(state, params) -> bool[n]``.

What the configuration selects:

* Shared actor parameters for every agent, optionally with the agent's one-hot
  id appended to its observation (``agent_id``).
* ``centralized_critic=True`` (MAPPO): the critic of agent ``i`` reads the
  world state plus ``i``'s one-hot id; ``False`` (IPPO): its own observation.
* ``normalize_values``: the critic predicts returns normalised by running
  statistics of the value targets (and the loss is measured there).
* ``input_norm``: a LayerNorm on the actor's and critic's inputs (MAPPO's
  feature normalisation), so raw world states (e.g. SMAX unit positions of
  ~20) do not start the critic at values far from the returns.
* Action masks: unavailable actions get a logit of -1e9, so they are never
  sampled nor chosen greedily. Death masking: a dead agent's critic input is
  zeros plus its id, and its transitions carry no loss.
* ``recurrent``: GRU actor and critic, hidden states zeroed when an episode
  begins; minibatches are then groups of whole environment sequences.
* ``baseline="group"``: no critic. Environments come in groups of
  ``group_size`` that share their environment randomness (reset and step keys),
  so a group's rollouts start from the same state; each agent's advantage is its
  discounted reward-to-go (cut at the rollout's end: nothing to bootstrap
  from) minus the mean of the same agent's reward-to-go over the group's
  rollouts at the same step. Episodes of a group that end at different times
  drift apart, and the baseline becomes approximate until they meet a reset
  together (fixed-length episodes stay in step).

Array layout: everything is ``[time, env, agent, ...]`` -- the agent axis stays
next to the environment axis from the environment to the loss, so there is no
agent-major/env-major reshuffle to get wrong. A feed-forward minibatch is a set
of ``(time, env)`` pairs with all their agents.

The ``Agent`` returned by ``make`` has the fields of rlx's single-agent agents
(``init``, ``update``, ``act``, ``value``) plus ``collect``, ``prepare`` and
``learn``, the parts of ``update``, exposed for tests. With ``recurrent=True``
it also has ``init_carry``, and ``act``/``value`` take and return a hidden state
(as in rlx's ``ppo_rnn.py``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "elu": nn.elu, "gelu": nn.gelu, "swish": nn.swish}
BASELINES = ("critic", "group")
MASKED_LOGIT = -1e9


def static(default):
    """A dataclass field that is part of the program's structure, not a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """MAPPO hyper-parameters.

    Numeric fields are traced leaves (sweepable under ``vmap`` without
    recompiling); ``static`` fields shape the program. ``total_timesteps``,
    ``num_envs`` and ``num_steps`` count joint environment steps (one step of
    every agent).
    """

    lr: float = 5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5

    total_timesteps: int = static(1_000_000)
    num_envs: int = static(16)
    num_steps: int = static(128)
    num_epochs: int = static(4)
    num_minibatches: int = static(4)
    hidden_sizes: tuple = static((64, 64))
    activation: str = static("relu")
    input_norm: bool = static(True)  # LayerNorm on actor and critic inputs (MAPPO's feature normalisation)
    agent_id: bool = static(True)  # one-hot agent id in the actor's input
    centralized_critic: bool = static(True)  # False: IPPO (critic on the agent's own observation)
    normalize_values: bool = static(True)  # value normalisation by running statistics of the targets
    recurrent: bool = static(False)  # GRU after the hidden layers of actor and critic
    gru_size: int = static(64)
    post_gru_sizes: tuple = static(())  # hidden layers between the GRU and the output layer (JaxMARL's has one)
    baseline: str = static("critic")  # "critic" (GAE) or "group" (critic-free, group-relative)
    group_size: int = static(8)  # environments per group with baseline="group"
    anneal_lr: bool = static(True)
    clip_value_loss: bool = static(True)
    normalize_advantages: bool = static(True)
    rollout_unroll: int = static(1)  # env steps per loop iteration of the rollout (a speed knob on accelerators)

    @property
    def batch_size(self) -> int:
        """Joint environment steps per update."""
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


PROJECTION_IN_SCAN_BYTES = 8 * 2**20  # a projected GRU input sequence larger than this is projected step by step


def validate(config: Config) -> None:
    """Raise ``ValueError("field=value: rule")`` for the first invalid field (plain Python, before tracing)."""
    minibatch_unit = "num_envs" if config.recurrent else "num_envs*num_steps"
    minibatch_total = config.num_envs if config.recurrent else config.batch_size
    rules = [
        ("lr", config.lr > 0, "must be > 0"),
        ("gamma", 0 <= config.gamma <= 1, "must be in [0, 1]"),
        ("gae_lambda", 0 <= config.gae_lambda <= 1, "must be in [0, 1]"),
        ("clip_eps", config.clip_eps > 0, "must be > 0"),
        ("vf_clip_eps", config.vf_clip_eps > 0, "must be > 0"),
        ("ent_coef", config.ent_coef >= 0, "must be >= 0"),
        ("vf_coef", config.vf_coef >= 0, "must be >= 0"),
        ("max_grad_norm", config.max_grad_norm > 0, "must be > 0"),
        ("adam_eps", config.adam_eps > 0, "must be > 0"),
        ("num_envs", config.num_envs >= 1, "must be >= 1"),
        ("num_steps", config.num_steps >= 1, "must be >= 1"),
        ("num_epochs", config.num_epochs >= 1, "must be >= 1"),
        ("num_minibatches", config.num_minibatches >= 1, "must be >= 1"),
        (
            "num_minibatches",
            config.num_minibatches >= 1 and minibatch_total % config.num_minibatches == 0,
            f"must divide {minibatch_unit}={minibatch_total}"
            + (" (a recurrent minibatch is a group of whole environment sequences)" if config.recurrent else ""),
        ),
        (
            "total_timesteps",
            config.num_envs >= 1 and config.num_steps >= 1 and config.num_updates >= 1,
            f"must be >= one batch (num_envs*num_steps={config.batch_size})",
        ),
        ("hidden_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.hidden_sizes),
         "every width must be an integer >= 1"),
        ("activation", config.activation in ACTIVATIONS, f"must be one of {sorted(ACTIVATIONS)}"),
        ("gru_size", config.gru_size >= 1, "must be >= 1"),
        ("post_gru_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.post_gru_sizes)
         and (config.recurrent or not config.post_gru_sizes), "every width must be an integer >= 1, with recurrent=true"),
        ("rollout_unroll", config.rollout_unroll >= 1, "must be >= 1"),
        ("baseline", config.baseline in BASELINES, f"must be one of {list(BASELINES)}"),
        ("group_size", config.baseline != "group" or config.group_size >= 2,
         "must be >= 2 with baseline='group' (a group of one has no baseline)"),
        ("group_size", config.baseline != "group" or config.num_envs % max(config.group_size, 1) == 0,
         f"must divide num_envs={config.num_envs} with baseline='group'"),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


# --------------------------------------------------------------------------- distribution


class Categorical(NamedTuple):
    """Discrete policy over the last axis of ``logits`` (already masked)."""

    logits: jax.Array

    def sample(self, seed):
        return jax.random.categorical(seed, self.logits)

    def log_prob(self, action):
        log_p = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(log_p, action[..., None].astype(jnp.int32), -1)[..., 0]

    def entropy(self):
        log_p = jax.nn.log_softmax(self.logits)
        return -(jnp.exp(log_p) * log_p).sum(-1)

    def mode(self):
        return jnp.argmax(self.logits, -1)


def masked_policy(logits, mask=None) -> Categorical:
    """The policy with unavailable actions (``mask`` False) at logit -1e9: probability exactly 0 in float32."""
    if mask is None:
        return Categorical(logits)
    return Categorical(jnp.where(mask, logits, MASKED_LOGIT))


# --------------------------------------------------------------------------- networks


class MLP(nn.Module):
    """Orthogonally initialised hidden layers (no output layer), optionally after a LayerNorm of the input."""

    sizes: tuple
    activation: str
    input_norm: bool = False

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        if self.input_norm:
            x = nn.LayerNorm()(x)
        for width in self.sizes:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return x


def _stacked_orthogonal(key, shape, dtype=jnp.float32):
    """Three independent orthogonal ``[n, n]`` blocks side by side, one per GRU gate."""
    n = shape[0]
    return jnp.concatenate([nn.initializers.orthogonal()(k, (n, n), dtype) for k in jax.random.split(key, 3)], -1)


class GRU(nn.Module):
    """A GRU split into ``project`` (input weights, any leading axes) and ``step`` (the recurrence)."""

    features: int

    def setup(self):
        self.input_dense = nn.Dense(3 * self.features)
        self.hidden_dense = nn.Dense(3 * self.features, kernel_init=_stacked_orthogonal)

    def project(self, x):
        return self.input_dense(x)

    def step(self, h, projected_x):
        xr, xz, xn = jnp.split(projected_x, 3, axis=-1)
        hr, hz, hn = jnp.split(self.hidden_dense(h), 3, axis=-1)
        r = nn.sigmoid(xr + hr)
        z = nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        return (1.0 - z) * n + z * h


class Branch(nn.Module):
    """Actor or critic: hidden layers, an optional GRU (then ``post_gru_sizes`` hidden layers), a linear output
    of ``out_dim`` units.

    Feed-forward: ``__call__(x)``. Recurrent: ``encode`` (any leading axes),
    ``recur`` (one GRU step; rows with ``reset`` start from zeros), ``output``.
    """

    out_dim: int
    out_scale: float
    hidden_sizes: tuple
    activation: str
    gru_size: int = 0  # 0: feed-forward
    input_norm: bool = False
    post_gru_sizes: tuple = ()

    def setup(self):
        self.body = MLP(self.hidden_sizes, self.activation, self.input_norm)
        if self.gru_size:
            self.gru = GRU(self.gru_size)
            self.after_gru = MLP(self.post_gru_sizes, self.activation)
        self.head = nn.Dense(self.out_dim, kernel_init=nn.initializers.orthogonal(self.out_scale))

    def __call__(self, x):
        return self.head(self.body(x))

    def encode(self, x):
        return self.gru.project(self.body(x))

    def recur(self, carry, projected, reset):
        carry = jnp.where(reset[..., None], jnp.zeros_like(carry), carry)
        return self.gru.step(carry, projected)

    def output(self, hidden):
        return self.head(self.after_gru(hidden))


class Network(nn.Module):
    """Shared actor (logits) and, unless critic-free, a critic (one value per agent)."""

    action_dim: int
    hidden_sizes: tuple
    activation: str
    gru_size: int = 0
    with_critic: bool = True
    input_norm: bool = False
    post_gru_sizes: tuple = ()

    def setup(self):
        branch = lambda out, scale: Branch(out, scale, self.hidden_sizes, self.activation, self.gru_size,  # noqa: E731
                                           self.input_norm, self.post_gru_sizes)
        self.actor = branch(self.action_dim, 0.01)
        if self.with_critic:
            self.critic = branch(1, 1.0)

    def __call__(self, actor_x, critic_x, carry, reset):
        """Touches every parameter (used by ``init`` only)."""
        branches = [self.actor] + ([self.critic] if self.with_critic else [])
        inputs = [actor_x, critic_x]
        if not self.gru_size:
            return [branch(x) for branch, x in zip(branches, inputs)]
        return [branch.output(branch.recur(carry, branch.encode(x), reset)) for branch, x in zip(branches, inputs)]


# --------------------------------------------------------------------------- inputs (the agent axis)


def with_agent_id(x, num_agents: int):
    """Append each agent's one-hot id: ``x [..., n, d] -> [..., n, d + n]``."""
    ids = jnp.broadcast_to(jnp.eye(num_agents, dtype=x.dtype), x.shape[:-1] + (num_agents,))
    return jnp.concatenate([x, ids], -1)


def flatten_trailing(x, rank: int):
    """Merge the last ``rank`` axes (a grid observation's, say) into one: MLPs take vectors."""
    return x.reshape(x.shape[:x.ndim - rank] + (-1,)) if rank != 1 else x


def actor_input(obs, num_agents: int, agent_id: bool, obs_rank: int = 1):
    """The actor's input ``[..., n, d (+ n)]``: the agent's observation (flattened if ``obs_rank`` > 1)
    and its one-hot id."""
    obs = flatten_trailing(obs, obs_rank).astype(jnp.float32)
    return with_agent_id(obs, num_agents) if agent_id else obs


def critic_input(obs, world_state, alive, num_agents: int, centralized: bool, agent_id: bool,
                 obs_rank: int = 1, state_rank: int = 1):
    """The critic's input per agent, ``[..., n, features]``, with death masking.

    Centralized: the world state ``[..., w]`` (flattened if ``state_rank`` > 1)
    copied to every agent, plus its one-hot id (the agent-specific global
    state). IPPO: the agent's own observation (plus its id when the actor gets
    one). A dead agent (``alive`` False) sees zeros in place of the state but
    keeps its id.
    """
    obs, world_state = flatten_trailing(obs, obs_rank), flatten_trailing(world_state, state_rank)
    if centralized:
        leading, width = world_state.shape[:-1], world_state.shape[-1]
        state = jnp.broadcast_to(world_state[..., None, :], leading + (num_agents, width))
    else:
        state = obs
    state = jnp.where(alive[..., None], state.astype(jnp.float32), 0.0)
    return with_agent_id(state, num_agents) if (centralized or agent_id) else state


# --------------------------------------------------------------------------- value normalisation


class RunningStats(NamedTuple):
    """Running mean and variance of a stream of (weighted) batches: Chan et al.'s parallel update."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls) -> "RunningStats":
        return cls(jnp.zeros(()), jnp.ones(()), jnp.asarray(1e-4))

    def update(self, batch: jax.Array, weights: jax.Array | None = None) -> "RunningStats":
        """Add the entries of ``batch`` (any shape) whose ``weights`` are 1 (all, without weights)."""
        weights = jnp.ones_like(batch) if weights is None else weights.astype(batch.dtype)
        n = weights.sum()
        batch_mean = (batch * weights).sum() / jnp.maximum(n, 1.0)
        batch_var = (((batch - batch_mean) ** 2) * weights).sum() / jnp.maximum(n, 1.0)
        total = self.count + n
        delta = batch_mean - self.mean
        mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        return RunningStats(mean, m2 / total, total)

    def normalize(self, x):
        return (x - self.mean) / jnp.sqrt(self.var + 1e-8)

    def denormalize(self, x):
        return x * jnp.sqrt(self.var + 1e-8) + self.mean


# --------------------------------------------------------------------------- returns and losses


def gae(rewards, values, next_values, terminated, done, gamma, lam):
    """GAE(lambda) advantages and value targets over ``[T, ...]`` (any trailing env/agent axes).

    ``next_values[t]`` is the value of the state step ``t`` reached before any
    auto-reset: cut by ``terminated`` (the agent's end), kept on truncation.
    ``done`` (the agent's end or the episode's) stops the recursion.
    """
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values

    def backward(carry, step):
        delta, done_t = step
        carry = delta + gamma * lam * (1.0 - done_t) * carry
        return carry, carry

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, done), reverse=True)
    return advantages, advantages + values


def discounted_returns(rewards, done, gamma):
    """Reward-to-go within each episode, ``[T, ...]``; the rollout's end counts as an end (no critic to bootstrap)."""

    def backward(following, step):
        reward, done_t = step
        ret = reward + gamma * (1.0 - done_t) * following
        return ret, ret

    _, returns = jax.lax.scan(backward, jnp.zeros_like(rewards[0]), (rewards, done), reverse=True)
    return returns


def group_relative_advantages(returns, weights, group_size: int):
    """``returns [T, E, n]`` minus the mean over each group of ``group_size`` consecutive envs.

    The mean is per agent index and time step, over the group members whose
    ``weights`` are 1 (alive agents); an agent alone in its group gets 0.
    """
    steps, envs, agents = returns.shape
    grouped = returns.reshape(steps, envs // group_size, group_size, agents)
    w = weights.astype(returns.dtype).reshape(grouped.shape)
    mean = (grouped * w).sum(2, keepdims=True) / jnp.maximum(w.sum(2, keepdims=True), 1.0)
    return (grouped - mean).reshape(returns.shape)


def masked_mean(x, weights):
    return (x * weights).sum() / jnp.maximum(weights.sum(), 1.0)


def ppo_loss_terms(config: Config, log_prob, old_log_prob, entropy, advantages, weights,
                   value=None, old_value=None, targets=None):
    """Clipped surrogate, (clipped) value loss and entropy, averaged over entries with ``weights`` 1.

    Values and targets are in the critic's (normalised) units; without a
    critic (``value is None``) there is no value loss.
    """
    if config.normalize_advantages:
        mean = masked_mean(advantages, weights)
        std = jnp.sqrt(masked_mean((advantages - mean) ** 2, weights))
        advantages = (advantages - mean) / (std + 1e-8)
    ratio = jnp.exp(log_prob - old_log_prob)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
    policy_loss = -masked_mean(jnp.minimum(ratio * advantages, clipped_ratio * advantages), weights)
    entropy = masked_mean(entropy, weights)
    terms = {
        "policy_loss": policy_loss,
        "entropy": entropy,
        "approx_kl": masked_mean((ratio - 1.0) - jnp.log(ratio), weights),
        "clip_fraction": masked_mean((jnp.abs(ratio - 1.0) > config.clip_eps).astype(jnp.float32), weights),
    }
    total = policy_loss - config.ent_coef * entropy
    if value is not None:
        value_error = (value - targets) ** 2
        if config.clip_value_loss:
            clipped_value = old_value + jnp.clip(value - old_value, -config.vf_clip_eps, config.vf_clip_eps)
            value_error = jnp.maximum(value_error, (clipped_value - targets) ** 2)
        terms["value_loss"] = 0.5 * masked_mean(value_error, weights)
        total = total + config.vf_coef * terms["value_loss"]
    return total, terms


# --------------------------------------------------------------------------- training state


class Transition(NamedTuple):
    """One joint step of every environment; arrays are ``[env, agent, ...]`` (``[T, env, agent, ...]`` stacked)."""

    actor_in: jax.Array  # actor input the action was chosen on
    critic_in: jax.Array  # critic input of the same state (death-masked)
    mask: jax.Array  # bool action mask of the state
    alive: jax.Array  # agent alive at decision time: the loss weight
    reset: jax.Array  # [env] the state begins an episode (recurrent replay)
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array  # critic estimate, in return units
    reward: jax.Array
    terminated: jax.Array  # the agent's end (cuts the bootstrap)
    done: jax.Array  # the agent's end, a truncation or the episode's end
    bootstrap_value: jax.Array  # where the agent's episode was cut without its end (truncation, the episode's
    # end): the value of the state reached, before any auto-reset, in return units; 0 elsewhere


class Batch(NamedTuple):
    """What the learning phase needs, ``[T, env, agent, ...]``."""

    actor_in: jax.Array
    critic_in: jax.Array
    mask: jax.Array
    weight: jax.Array
    reset: jax.Array  # [T, env]
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array  # the critic's output when it acted, in its own units (normalised where values are)
    advantage: jax.Array
    target: jax.Array  # in return units


def make_minibatches(batch: Batch, start_carry, key, num_minibatches: int, recurrent: bool):
    """Shuffle a ``[T, env, agent, ...]`` batch into minibatches with a leading ``num_minibatches`` axis.

    Feed-forward: ``(time, env)`` pairs in random order, each with all its
    agents: ``[M, T*E/M, n, ...]`` (``reset`` ``[M, T*E/M]``). Recurrent: groups
    of whole env sequences, ``[M, T, E/M, n, ...]``, with the carries ``[M, E/M,
    n, H]`` they started from. The carries are returned as placeholders
    ``[M]`` when feed-forward.
    """
    steps, envs = batch.reset.shape
    if recurrent:
        groups = jax.random.permutation(key, envs).reshape(num_minibatches, -1)
        sequences = jax.tree.map(lambda x: jnp.moveaxis(x[:, groups], 1, 0), batch)
        return sequences, jax.tree.map(lambda c: c[groups], start_carry)
    flat = jax.tree.map(lambda x: x.reshape((steps * envs,) + x.shape[2:]), batch)
    order = jax.random.permutation(key, steps * envs)
    shuffled = jax.tree.map(lambda x: x[order].reshape((num_minibatches, -1) + x.shape[1:]), flat)
    return shuffled, jax.tree.map(lambda c: jnp.zeros((num_minibatches,)), start_carry)


class Policy(NamedTuple):
    """What acting and valuing need: flat network parameters and the value statistics."""

    params: Any
    value_stats: RunningStats


class TrainState(struct.PyTreeNode):
    params: Any
    opt_state: Any
    env_state: Any
    obs: jax.Array  # [env, agent, ...]
    value_stats: RunningStats
    actor_carry: jax.Array  # [env, agent, gru] recurrent, else a [env, agent, 1] placeholder (checkpointable)
    critic_carry: jax.Array
    reset: jax.Array  # [env] obs begins an episode
    episode_return: jax.Array  # [env, agent] running undiscounted return
    last_episode_return: jax.Array  # [env] team return of the last finished episode (mean over agents)
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array

    @property
    def policy(self) -> Policy:
        return Policy(self.params, self.value_stats)


class Agent(NamedTuple):
    init: Callable  # key -> TrainState
    update: Callable  # TrainState -> (TrainState, metrics)
    act: Callable  # (Policy, obs [..., n, d], key, greedy, mask) -> actions [..., n]
    value: Callable  # (Policy, obs, world_state, alive) -> values [..., n]
    collect: Callable  # TrainState -> (TrainState, Transition [T, ...])
    prepare: Callable  # (TrainState, Transition) -> (value statistics, Batch [T, ...])
    learn: Callable  # (TrainState, Transition, start carries) -> (TrainState, metrics)


class RecurrentAgent(NamedTuple):
    init: Callable
    update: Callable
    act: Callable  # (Policy, carry, obs, reset, key, greedy, mask) -> (carry, actions)
    value: Callable  # (Policy, carry, obs, world_state, reset, alive) -> (carry, values)
    collect: Callable
    prepare: Callable
    learn: Callable
    init_carry: Callable  # batch_size -> zeros [batch, n, gru_size] ([n, gru_size] for None)


def make(config: Config, env, env_params):
    """Build MAPPO's pure functions for one multi-agent environment."""
    n = int(env.num_agents)
    action_dim = int(env.action_space(env_params).n)
    critic_free = config.baseline == "group"
    gru = config.gru_size if config.recurrent else 0
    network = Network(action_dim, tuple(config.hidden_sizes), config.activation, gru, not critic_free,
                      config.input_norm, tuple(config.post_gru_sizes))
    has_mask, has_alive = hasattr(env, "action_mask"), hasattr(env, "alive")

    obs_spec, state_spec = jax.eval_shape(env.reset, jax.random.PRNGKey(0), env_params)
    world_spec = jax.eval_shape(env.world_state, state_spec, env_params)
    obs_rank, state_rank = len(obs_spec.shape) - 1, len(world_spec.shape)  # grids are flattened

    def actor_in(obs):
        return actor_input(obs, n, config.agent_id, obs_rank)

    def critic_in_of(obs, world, alive):
        return critic_input(obs, world, alive, n, config.centralized_critic, config.agent_id, obs_rank, state_rank)

    zeros_obs = jnp.zeros(obs_spec.shape, jnp.float32)
    example_actor = actor_in(zeros_obs)
    example_critic = critic_in_of(zeros_obs, jnp.zeros(world_spec.shape), jnp.ones(n, bool))
    example = (example_actor, example_critic, jnp.zeros((n, max(gru, 1))), jnp.zeros(n, bool))
    # One flat parameter vector for the optimiser (fewer, fused kernels), unflattened to apply.
    template = jax.eval_shape(network.init, jax.random.PRNGKey(0), *example)
    _, unravel = ravel_pytree(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), template))

    updates_per_iteration = config.num_epochs * config.num_minibatches

    def learning_rate(count):
        if not config.anneal_lr:
            return config.lr
        return config.lr * jnp.maximum(1.0 - (count // updates_per_iteration) / config.num_updates, 0.0)  # 0 past the end

    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=config.adam_eps),
    )

    # -- the environment, batched over envs -----------------------------------------------------
    def env_keys(key):
        """One key per env; with the group baseline, the envs of a group share theirs."""
        if critic_free:
            return jnp.repeat(jax.random.split(key, config.num_envs // config.group_size), config.group_size, 0)
        return jax.random.split(key, config.num_envs)

    def env_masks(env_state):
        if has_mask:
            return jax.vmap(env.action_mask, in_axes=(0, None))(env_state, env_params).astype(bool)
        return jnp.ones((config.num_envs, n, action_dim), bool)

    def env_alive(env_state):
        if has_alive:
            return jax.vmap(env.alive, in_axes=(0, None))(env_state, env_params).astype(bool)
        return jnp.ones((config.num_envs, n), bool)

    def env_world(env_state):
        return jax.vmap(env.world_state, in_axes=(0, None))(env_state, env_params)

    # -- the networks ------------------------------------------------------------------------------
    def to_values(stats, raw):
        raw = raw[..., 0]
        return stats.denormalize(raw) if config.normalize_values else raw

    def as_rows(apply, x, *more):
        """``apply`` to ``x [..., d]`` (and ``more`` arrays with the same leading axes) as ``[rows, d]`` matrices,
        outputs reshaped back: XLA's CPU kernels are slower on ``[..., env, agent, d]`` arrays (a learning epoch
        of the benchmark's recurrent network took 1.16x as long, of the feed-forward one 1.3x).

        Under a vmap over seeds, jaxlib 0.10's YNNPACK reduction for the input LayerNorm's gradient is very slow
        on these rows (updates 2-3x slower on MAPF's 484-wide windows); ``rlx.runner.compile_cache`` turns it off
        with ``--xla_cpu_experimental_ynn_fusion_type=-reduce``, which a vendored copy may want too."""
        lead = x.shape[:-1]
        outputs = apply(*(a.reshape((-1,) + a.shape[len(lead):]) for a in (x,) + more))
        return jax.tree.map(lambda out: out.reshape(lead + out.shape[1:]), outputs)

    def actor_ff(params, x):
        return as_rows(lambda rows: network.apply(params, rows, method=lambda m, x: m.actor(x)), x)

    def critic_ff(params, x):
        return as_rows(lambda rows: network.apply(params, rows, method=lambda m, x: m.critic(x)), x)

    def branch_step(params, name, carry, x, reset):
        """One recurrent step of the actor or critic: (new carry, output)."""

        def step(m, x, carry, reset):
            branch = getattr(m, name)
            carry = branch.recur(carry, branch.encode(x), reset)
            return carry, branch.output(carry)

        return as_rows(lambda *rows: network.apply(params, *rows, method=step), x, carry, reset)

    def branch_unroll(params, name, carry, xs, resets):
        """Replay ``xs [T, rows, d]`` from ``carry [rows, H]`` with ``resets [T, rows]``: outputs ``[T, rows, ...]``.

        Step ``t`` gives what ``branch_step`` gives on ``xs[t]`` with the carry left by step ``t - 1``.
        """
        in_scan = project_in_scan(xs)  # else the whole sequence is projected before the scan
        before = (lambda m, x: getattr(m, name).body(x)) if in_scan else (lambda m, x: getattr(m, name).encode(x))
        inside = (lambda m, x: getattr(m, name).gru.project(x)) if in_scan else (lambda m, x: x)

        def step(h, inputs):
            h = network.apply(params, h, *inputs, method=lambda m, h, x, r: getattr(m, name).recur(h, inside(m, x), r))
            return h, h

        carry, hidden = jax.lax.scan(step, carry, (network.apply(params, xs, method=before), resets))
        return network.apply(params, hidden, method=lambda m, h: getattr(m, name).output(h))

    def project_in_scan(xs) -> bool:
        """Whether to apply the GRU's input projection inside the replay scan, a step at a time, rather than to
        the whole sequence before it. On a CPU, a projected sequence beyond a few MB (3 x gru_size floats per
        row and as much gradient: 150 MB per branch at 1024 envs) leaves the cache and costs 1.2x per update
        (1024 envs; 1.06x at 128); below that, one large product beats 128 small ones (1.33x at 16 envs)."""
        rows = int(np.prod(xs.shape[:-1]))
        return jax.default_backend() == "cpu" and rows * 3 * config.gru_size * 4 > PROJECTION_IN_SCAN_BYTES

    def agent_resets(reset, like):
        """Per-env (or per-agent) reset flags broadcast to the agents of ``like [..., n, d]``."""
        reset = jnp.asarray(reset, bool)
        if reset.ndim == like.ndim - 2:
            reset = reset[..., None]
        return jnp.broadcast_to(reset, like.shape[:-1])

    # -- the public acting functions ----------------------------------------------------------
    def all_alive(obs):
        """``[..., n]`` True: the leading axes of ``obs``, without its ``obs_rank`` observation axes."""
        return jnp.ones(obs.shape[:obs.ndim - obs_rank], bool)

    def act(policy: Policy, obs, key, greedy: bool = False, mask=None):
        """Actions ``[..., n]`` for observations ``[..., n, d]``; actions where ``mask`` is False never come out."""
        logits = actor_ff(unravel(policy.params), actor_in(obs))
        dist = masked_policy(logits, mask)
        return dist.mode() if greedy else dist.sample(seed=key)

    def value(policy: Policy, obs, world_state, alive=None):
        """The critic's estimates ``[..., n]`` (zeros without a critic)."""
        alive = all_alive(obs) if alive is None else alive
        return read_critic(unravel(policy.params), policy.value_stats, None, critic_in_of(obs, world_state, alive))[1]

    def act_recurrent(policy: Policy, carry, obs, reset, key, greedy: bool = False, mask=None):
        """Read ``obs [..., n, d]`` (zeroing the carry where ``reset``, per env or per agent); ``(carry, actions)``."""
        x = actor_in(obs)
        carry, logits = branch_step(unravel(policy.params), "actor", carry, x, agent_resets(reset, x))
        dist = masked_policy(logits, mask)
        return carry, dist.mode() if greedy else dist.sample(seed=key)

    def value_recurrent(policy: Policy, carry, obs, world_state, reset, alive=None):
        alive = all_alive(obs) if alive is None else alive
        x = critic_in_of(obs, world_state, alive)
        return read_critic(unravel(policy.params), policy.value_stats, carry, x, agent_resets(reset, x))

    def read_critic(params, value_stats, carry, c_in, resets=None):
        """``(carry, values [..., n])``: the critic's values (return units) of the inputs ``c_in [..., n, d]``;
        recurrent, read from ``carry`` (zeroed where ``resets``) and the carry after; zeros without a critic."""
        if critic_free:
            return carry, jnp.zeros(c_in.shape[:-1])
        if gru:
            carry, raw = branch_step(params, "critic", carry, c_in, resets)
        else:
            raw = critic_ff(params, c_in)
        return carry, to_values(value_stats, raw)

    def init_carry(batch_size: int | None = None):
        shape = (n, config.gru_size) if batch_size is None else (batch_size, n, config.gru_size)
        return jnp.zeros(shape, jnp.float32)

    # -- training ----------------------------------------------------------------------------------
    def init(key) -> TrainState:
        net_key, env_key, key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(env_keys(env_key), env_params)
        params, _ = ravel_pytree(network.init(net_key, *example))
        carry = jnp.zeros((config.num_envs, n, max(gru, 1)))
        return TrainState(
            params=params,
            opt_state=optimizer.init(params),
            env_state=env_state,
            obs=obs,
            value_stats=RunningStats.create(),
            actor_carry=carry,
            critic_carry=carry,
            reset=jnp.ones(config.num_envs, bool),
            episode_return=jnp.zeros((config.num_envs, n)),
            last_episode_return=jnp.zeros(config.num_envs),
            key=key,
            update_step=jnp.asarray(0, jnp.int32),
            env_steps=jnp.asarray(0, jnp.int32),
        )

    def collect(state: TrainState):
        """Roll out ``num_steps`` joint steps of every env with the current policy: ``(state, Transition [T, ...])``."""
        params = unravel(state.params)

        def env_step(state: TrainState, _):
            key, act_key, step_key = jax.random.split(state.key, 3)
            alive, mask, world = env_alive(state.env_state), env_masks(state.env_state), env_world(state.env_state)
            a_in = actor_in(state.obs)
            c_in = critic_in_of(state.obs, world, alive)
            actor_carry, critic_carry = state.actor_carry, state.critic_carry
            resets = agent_resets(state.reset, a_in)
            if gru:
                actor_carry, logits = branch_step(params, "actor", actor_carry, a_in, resets)
            else:
                logits = actor_ff(params, a_in)
            critic_carry, val = read_critic(params, state.value_stats, critic_carry, c_in, resets)
            dist = masked_policy(logits, mask)
            action = dist.sample(seed=act_key)
            log_prob = dist.log_prob(action)

            next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                env_keys(step_key), state.env_state, action, env_params
            )
            reward = reward.astype(jnp.float32)
            terminated = jnp.broadcast_to(terminated, (config.num_envs, n)).astype(bool)
            truncated = jnp.broadcast_to(truncated, (config.num_envs, n)).astype(bool)
            episode_over = info.get("episode_over", terminated.all(-1) | truncated[:, 0])
            done = terminated | truncated | episode_over[:, None]
            cut = done & ~terminated
            bootstrap = cut_values(params, state.value_stats, critic_carry, info, world, terminated, cut)

            episode_return = state.episode_return + reward
            transition = Transition(
                actor_in=a_in, critic_in=c_in, mask=mask, alive=alive, reset=state.reset, action=action,
                log_prob=log_prob, value=val, reward=reward, terminated=terminated.astype(jnp.float32),
                done=done.astype(jnp.float32), bootstrap_value=bootstrap,
            )
            # The carries stay as they are where an episode ended: ``reset`` zeroes them at the next read.
            state = state.replace(
                env_state=env_state,
                obs=next_obs,
                actor_carry=actor_carry,
                critic_carry=critic_carry,
                reset=episode_over,
                episode_return=jnp.where(episode_over[:, None], 0.0, episode_return),
                last_episode_return=jnp.where(episode_over, episode_return.mean(-1), state.last_episode_return),
                key=key,
            )
            return state, transition

        return jax.lax.scan(env_step, state, None, config.num_steps, unroll=config.rollout_unroll)

    def cut_values(params, value_stats, critic_carry, info, world, terminated, cut):
        """``[env, agent]``: where ``cut``, the critic's value of the state a step reached before any auto-reset
        (read with the critic's memory after the step, no reset); 0 elsewhere.

        Episodes are cut in few steps (one in 25 for MPE's time limit), so the critic runs only in those
        (``lax.cond``; under a vmap over seeds it runs in every step, as a batched pass after the rollout would).
        """
        if critic_free:
            return jnp.zeros(cut.shape)

        def values():
            final_world = info["final_world_state"] if config.centralized_critic else world  # IPPO: unused
            final_c_in = critic_in_of(info["final_observation"], final_world, ~terminated)
            _, reached = read_critic(params, value_stats, critic_carry, final_c_in, jnp.zeros(cut.shape, bool))
            return jnp.where(cut, reached, 0.0)

        return jax.lax.cond(cut.any(), values, lambda: jnp.zeros(cut.shape))

    def last_values(state: TrainState):
        """The critic's values ``[env, agent]`` of the states a rollout stopped in (``state`` after ``collect``)."""
        c_in = critic_in_of(state.obs, env_world(state.env_state), env_alive(state.env_state))
        return read_critic(unravel(state.params), state.value_stats, state.critic_carry, c_in,
                           agent_resets(state.reset, c_in))[1]

    def advantages_and_targets(state: TrainState, traj: Transition):
        """Advantages and value targets (return units), ``[T, env, agent]``, from the rollout ``traj`` and the
        state ``collect`` left (whose states the last step reached)."""
        if critic_free:
            returns = discounted_returns(traj.reward, traj.done, config.gamma)
            return group_relative_advantages(returns, traj.alive, config.group_size), returns
        # The state step t reached: step t + 1's, unless the episode was cut there (bootstrap_value) or ended.
        following = jnp.concatenate([traj.value[1:], last_values(state)[None]])
        cut = (traj.done > 0) & (traj.terminated == 0)
        next_values = jnp.where(cut, traj.bootstrap_value, following)
        return gae(traj.reward, traj.value, next_values, traj.terminated, traj.done, config.gamma, config.gae_lambda)

    def minibatch_loss(flat_params, minibatch: Batch, start_carry, value_stats: RunningStats):
        params = unravel(flat_params)
        minibatch, start_carry = as_agent_rows(minibatch, start_carry)
        if gru:
            logits = branch_unroll(params, "actor", start_carry[0], minibatch.actor_in, minibatch.reset)
        else:
            logits = actor_ff(params, minibatch.actor_in)
        dist = masked_policy(logits, minibatch.mask)
        value_terms = {}
        if not critic_free:
            if gru:
                raw = branch_unroll(params, "critic", start_carry[1], minibatch.critic_in, minibatch.reset)
            else:
                raw = critic_ff(params, minibatch.critic_in)
            norm = value_stats.normalize if config.normalize_values else (lambda x: x)
            value_terms = dict(value=raw[..., 0], old_value=minibatch.value, targets=norm(minibatch.target))
        return ppo_loss_terms(config, dist.log_prob(minibatch.action), minibatch.log_prob, dist.entropy(),
                              minibatch.advantage, minibatch.weight.astype(jnp.float32), **value_terms)

    def as_agent_rows(minibatch: Batch, start_carry):
        """A minibatch with one row per (env, agent): ``[T, env * agent, ...]`` recurrent (``reset`` per agent,
        carries ``[env * agent, H]``), ``[sample * agent, ...]`` feed-forward. The loss is a mean over entries,
        so only the speed changes (see ``as_rows``)."""
        minibatch = minibatch._replace(reset=agent_resets(minibatch.reset, minibatch.actor_in))
        time_axes = 1 if gru else 0
        merge = lambda x: x.reshape(x.shape[:time_axes] + (-1,) + x.shape[time_axes + 2:])  # noqa: E731
        if gru:
            start_carry = jax.tree.map(lambda c: c.reshape((-1, c.shape[-1])), start_carry)
        return jax.tree.map(merge, minibatch), start_carry

    grad_fn = jax.value_and_grad(minibatch_loss, has_aux=True)

    def prepare(state: TrainState, traj: Transition):
        """Advantages, value targets and the value statistics updated with the alive agents' targets.

        Returns ``(value_stats, Batch [T, env, agent, ...])``; the loss weight is the alive flag.
        """
        advantages, targets = advantages_and_targets(state, traj)
        value_stats, old_value = state.value_stats, traj.value
        if config.normalize_values and not critic_free:
            # The value clip is centred on what the critic output when it acted, in its own (normalised)
            # units, so under the statistics it acted with, not the ones updated below.
            old_value = value_stats.normalize(traj.value)
            value_stats = value_stats.update(targets, traj.alive)
        batch = Batch(actor_in=traj.actor_in, critic_in=traj.critic_in, mask=traj.mask, weight=traj.alive,
                      reset=traj.reset, action=traj.action, log_prob=traj.log_prob, value=old_value,
                      advantage=advantages, target=targets)
        return value_stats, batch

    def learn(state: TrainState, traj: Transition, start_carry=None):
        """The learning half of an update: ``prepare``, then ``num_epochs`` of minibatch steps.

        ``start_carry`` is ``(actor carry, critic carry)`` from before ``collect``
        (where the recurrent replay starts); feed-forward agents ignore it.
        """
        value_stats, batch = prepare(state, traj)

        def learn_epoch(carry, _):
            params, opt_state, key = carry
            key, perm_key = jax.random.split(key)
            minibatches, carries = make_minibatches(batch, start_carry, perm_key, config.num_minibatches, bool(gru))

            def learn_minibatch(carry, inputs):
                params, opt_state = carry
                minibatch, start = inputs
                (loss, terms), grads = grad_fn(params, minibatch, start, value_stats)
                updates, opt_state = optimizer.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
                return (params, opt_state), {"loss": loss, "grad_norm": optax.tree.norm(grads), **terms}

            (params, opt_state), metrics = jax.lax.scan(learn_minibatch, (params, opt_state), (minibatches, carries))
            return (params, opt_state, key), metrics

        key, learn_key = jax.random.split(state.key)
        (params, opt_state, _), metrics = jax.lax.scan(
            learn_epoch, (state.params, state.opt_state, learn_key), None, config.num_epochs
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        state = state.replace(params=params, opt_state=opt_state, value_stats=value_stats, key=key)
        return state, metrics

    def update(state: TrainState):
        start_carry = (state.actor_carry, state.critic_carry)  # the replay starts here (zeroed where reset)
        state, traj = collect(state)
        state, metrics = learn(state, traj, start_carry)
        state = state.replace(update_step=state.update_step + 1, env_steps=state.env_steps + config.batch_size)
        metrics["train_return"] = state.last_episode_return.mean()
        metrics["learning_rate"] = learning_rate(state.update_step * updates_per_iteration - 1)
        metrics["alive_fraction"] = traj.alive.mean()
        if not critic_free:
            alive = traj.alive.astype(jnp.float32)  # as the losses weigh them: dead agents' values are not estimates
            metrics["value_mean"] = (traj.value * alive).sum() / jnp.maximum(alive.sum(), 1.0)
        return state, metrics

    if gru:
        return RecurrentAgent(init, update, act_recurrent, value_recurrent, collect, prepare, learn, init_carry)
    return Agent(init, update, act, value, collect, prepare, learn)


def train(config: Config, env, env_params, key, num_updates: int | None = None):
    """Train from scratch: ``init`` then ``num_updates`` (default: all) updates under ``lax.scan``."""
    agent = make(config, env, env_params)

    def run(key):
        state = agent.init(key)
        return jax.lax.scan(lambda s, _: agent.update(s), state, None, num_updates or config.num_updates)

    return jax.jit(run)(key)


# --------------------------------------------------------------------------- a demo environment


class _Discrete(NamedTuple):
    n: int


class _Box(NamedTuple):
    shape: tuple


@struct.dataclass
class CardGameState:
    cards: jax.Array  # int32[n]
    disabled: jax.Array  # int32[n]: each agent's disabled action this step, -1 for none
    time: jax.Array


@struct.dataclass
class CardGameParams:
    max_steps_in_episode: int = 8
    mask_prob: float = 0.5


class CardGame:
    """A cooperative card game in the array-per-agent contract (rlx's ``Coop`` without deaths).

    Every step each of ``n`` agents gets a random card in ``0..K-1`` and sees its
    own and its teammates' cards. The team target is the sum of the cards mod
    ``K``; each agent names a target, and the shared reward is the fraction of
    agents that named it. With probability 1/2 an agent has one random action
    disabled (the action mask), which scores nothing. Episodes last 8 steps: the
    optimal return is ``8 * (1 - 0.5/K) = 6.67`` for ``K = 3``; a policy that
    ignores its teammates gets at most ``8 / K = 2.67`` (the target is uniform
    given its own card).
    """

    def __init__(self, num_agents: int = 2, num_cards: int = 3):
        self.num_agents, self.num_cards = num_agents, num_cards

    @property
    def default_params(self):
        return CardGameParams()

    def _draw(self, key, time, params):
        card_key, mask_key, which_key = jax.random.split(key, 3)
        n, k = self.num_agents, self.num_cards
        masked = jax.random.bernoulli(mask_key, params.mask_prob, (n,))
        return CardGameState(jax.random.randint(card_key, (n,), 0, k),
                             jnp.where(masked, jax.random.randint(which_key, (n,), 0, k), -1),
                             jnp.asarray(time, jnp.int32))

    def _obs(self, state, params):
        n = self.num_agents
        order = (jnp.arange(n)[:, None] + jnp.arange(n)[None, :]) % n  # own card first, then teammates
        cards = jax.nn.one_hot(state.cards, self.num_cards)[order].reshape(n, -1)
        return jnp.concatenate([cards, jnp.full((n, 1), state.time / params.max_steps_in_episode)], -1)

    def world_state(self, state, params):
        return jnp.concatenate([jax.nn.one_hot(state.cards, self.num_cards).reshape(-1),
                                jnp.asarray(state.time / params.max_steps_in_episode)[None]])

    def action_mask(self, state, params):
        return jnp.arange(self.num_cards)[None, :] != state.disabled[:, None]

    def alive(self, state, params):
        return jnp.ones(self.num_agents, bool)

    def action_space(self, params=None):
        return _Discrete(self.num_cards)

    def observation_space(self, params=None):
        return _Box((self.num_agents * self.num_cards + 1,))

    def reset(self, key, params=None):
        params = self.default_params if params is None else params
        state = self._draw(key, 0, params)
        return self._obs(state, params), state

    def step(self, key, state, actions, params=None):
        params = self.default_params if params is None else params
        step_key, reset_key = jax.random.split(key)
        target = state.cards.sum() % self.num_cards
        scored = (actions == target) & (actions != state.disabled)
        reward = jnp.full(self.num_agents, scored.mean())
        stepped = self._draw(step_key, state.time + 1, params)
        over = stepped.time >= params.max_steps_in_episode
        fresh = self._draw(reset_key, 0, params)
        next_state = jax.tree.map(lambda a, b: jax.lax.select(over, a, b), fresh, stepped)
        info = {"final_observation": self._obs(stepped, params), "final_world_state": self.world_state(stepped, params),
                "episode_over": over}
        terminated = jnp.zeros(self.num_agents, bool)
        truncated = jnp.full(self.num_agents, over)
        return self._obs(next_state, params), next_state, reward, terminated, truncated, info


def _cli():
    import argparse
    import os
    import time

    # Works around a hang of jaxlib 0.10's CPU runtime on some vmapped programs; added to any
    # XLA_FLAGS the user already set (unless they name the scheduler themselves).
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()

    parser = argparse.ArgumentParser(
        description="Train MAPPO on a two-agent cooperative card game (optimum 6.67, teammate-blind bound 2.67).")
    parser.add_argument("--timesteps", type=int, default=40_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ippo", action="store_true", help="critic on each agent's own observation")
    parser.add_argument("--group", action="store_true", help="critic-free group-relative baseline")
    parser.add_argument("--recurrent", action="store_true", help="GRU actor and critic")
    args = parser.parse_args()
    env = CardGame()
    config = Config(
        total_timesteps=args.timesteps, num_envs=16, num_steps=32, lr=3e-3, ent_coef=0.05, gamma=0.9,
        centralized_critic=not args.ippo, recurrent=args.recurrent,
        baseline="group" if args.group else "critic",
    )
    validate(config)
    start = time.perf_counter()
    state, metrics = train(config, env, env.default_params, jax.random.PRNGKey(args.seed))
    returns = np.asarray(metrics["train_return"])
    step = max(1, len(returns) // 10)
    for i in range(step - 1, len(returns), step):
        print(f"update {i + 1:5d}  env steps {(i + 1) * config.batch_size:8d}  train return {returns[i]:7.2f}")
    print(f"final train return {returns[-1]:.2f} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    _cli()
