"""Recurrent PPO: a GRU policy and critic, as pure, jittable functions in one file.

Vendorable: this file imports only jax, flax, optax and numpy (gymnax only in
its command-line demo). Copy it into your project and run ``python ppo_rnn.py``
to train on bsuite's MemoryChain, a task no feed-forward policy can solve.

The API follows rlx's ``ppo.py``, with the memory made explicit:

* ``Config`` -- a ``flax.struct`` dataclass. Numeric hyper-parameters are pytree
  leaves (sweepable under ``vmap``); fields that decide shapes are static.
* ``make(config, env, env_params)`` -> ``Agent`` of pure functions:
  ``init(key) -> state``, ``update(state) -> (state, metrics)``,
  ``init_carry(batch_size) -> carry`` (zero hidden states),
  ``act(policy, carry, obs, reset, key, greedy) -> (carry, action)`` and
  ``value(policy, carry, obs, reset) -> (carry, value)``. ``reset[i]`` says that
  ``obs[i]`` begins a new episode: its hidden state is zeroed before use.
* ``train(config, env, env_params, key)`` -- ``init`` plus a ``lax.scan`` of ``update``.

Training keeps one hidden state per environment across updates. Each rollout
remembers the hidden states it started from, so the learning phase can replay
whole sequences through the GRU (back-propagating through time); minibatches
are therefore groups of environments, never shuffled time steps.

Environments follow the gymnax 1.0 API: ``step`` returns ``(obs, state, reward,
terminated, truncated, info)`` with auto-reset and ``info["final_observation"]``
holding the observation before the reset.
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


def static(default):
    """A dataclass field that shapes the program instead of being a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """Recurrent PPO hyper-parameters.

    Numeric fields are traced leaves; ``static`` fields shape the program. The
    network is: observation -> MLP ``hidden_sizes`` -> GRU of ``gru_size`` units
    -> separate actor and critic MLPs of ``head_sizes``.
    """

    lr: float = 1e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5
    init_log_std: float = 0.0

    total_timesteps: int = static(500_000)
    num_envs: int = static(16)
    num_steps: int = static(64)
    num_epochs: int = static(4)
    num_minibatches: int = static(4)
    hidden_sizes: tuple = static((64,))
    gru_size: int = static(64)
    head_sizes: tuple = static((64,))
    activation: str = static("tanh")
    anneal_lr: bool = static(True)
    clip_value_loss: bool = static(True)
    normalize_advantages: bool = static(True)
    normalize_observations: bool = static(False)
    normalize_rewards: bool = static(False)
    clip_observations: float = static(10.0)

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


def validate(config: Config) -> None:
    """Raise ``ValueError("field=value: rule")`` for the first invalid field (plain Python, before tracing)."""
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
        ("clip_observations", config.clip_observations > 0, "must be > 0"),
        ("num_envs", config.num_envs >= 1, "must be >= 1"),
        ("num_steps", config.num_steps >= 1, "must be >= 1"),
        ("num_epochs", config.num_epochs >= 1, "must be >= 1"),
        ("num_minibatches", config.num_minibatches >= 1, "must be >= 1"),
        (
            "num_minibatches",
            config.num_minibatches >= 1 and config.num_envs % config.num_minibatches == 0,
            f"must divide num_envs={config.num_envs} (a minibatch is a group of whole environment sequences)",
        ),
        (
            "total_timesteps",
            config.num_envs >= 1 and config.num_steps >= 1 and config.num_updates >= 1,
            f"must be >= one batch (num_envs*num_steps={config.batch_size})",
        ),
        ("hidden_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.hidden_sizes),
         "every width must be an integer >= 1"),
        ("gru_size", config.gru_size >= 1, "must be >= 1"),
        ("head_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.head_sizes),
         "every width must be an integer >= 1"),
        ("activation", config.activation in ACTIVATIONS, f"must be one of {sorted(ACTIVATIONS)}"),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


# --------------------------------------------------------------------------- distributions


class Categorical(NamedTuple):
    """Discrete policy; ``logits`` has the actions on its last axis."""

    logits: jax.Array

    def sample(self, seed):
        return jax.random.categorical(seed, self.logits)

    def log_prob(self, action):
        log_probs = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(log_probs, action[..., None].astype(jnp.int32), -1)[..., 0]

    def entropy(self):
        log_probs = jax.nn.log_softmax(self.logits)
        return -(jnp.exp(log_probs) * log_probs).sum(-1)

    def mode(self):
        return jnp.argmax(self.logits, -1)


class DiagGaussian(NamedTuple):
    """Gaussian policy whose action dimensions (last axis) are independent."""

    mean: jax.Array
    log_std: jax.Array

    def sample(self, seed):
        return self.mean + jnp.exp(self.log_std) * jax.random.normal(seed, self.mean.shape)

    def log_prob(self, action):
        z = (action - self.mean) * jnp.exp(-self.log_std)
        return (-0.5 * z**2 - self.log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)

    def entropy(self):
        return (self.log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e)).sum(-1)

    def mode(self):
        return self.mean


# --------------------------------------------------------------------------- networks


class MLP(nn.Module):
    """Orthogonally initialised layers; with ``out_dim`` a final linear layer scaled by ``out_scale``.

    With ``obs_rank`` > 1 the trailing ``obs_rank`` axes (a grid observation)
    are flattened to one vector first.
    """

    sizes: tuple
    activation: str
    out_dim: int | None = None
    out_scale: float = 1.0
    obs_rank: int = 1

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        if self.obs_rank > 1:
            x = x.astype(jnp.float32).reshape(x.shape[: x.ndim - self.obs_rank] + (-1,))
        for width in self.sizes:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        if self.out_dim is not None:
            x = nn.Dense(self.out_dim, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)
        return x


def _stacked_orthogonal(key, shape, dtype=jnp.float32):
    """Three independent orthogonal ``[n, n]`` blocks side by side, one per GRU gate."""
    n = shape[0]
    return jnp.concatenate([nn.initializers.orthogonal()(k, (n, n), dtype) for k in jax.random.split(key, 3)], -1)


class GRU(nn.Module):
    """A gated recurrent unit split in two halves.

    ``project`` applies the input weights of all three gates and can run on a
    whole ``[T, B, ...]`` sequence at once; ``step`` holds only the recurrent
    part, so the sequential loop does one small matrix product per step.
    The maths is the usual GRU (as in ``flax.linen.GRUCell``):
    ``r, z = sigmoid(W x + U h)``, ``n = tanh(W_n x + r * (U_n h + b))``,
    ``h' = (1 - z) n + z h``.
    """

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


class RecurrentActorCritic(nn.Module):
    """Shared encoder and GRU, then separate actor and critic heads.

    Called in three parts so that only the recurrence runs step by step:
    ``encode`` (observations -> projected GRU inputs, any leading axes),
    ``recur`` (one GRU step with episode resets) and ``heads`` (hidden states ->
    policy distribution and value, any leading axes).
    """

    action_dim: int
    continuous: bool
    hidden_sizes: tuple
    gru_size: int
    head_sizes: tuple
    activation: str
    init_log_std: float = 0.0
    obs_rank: int = 1

    def setup(self):
        self.encoder = MLP(self.hidden_sizes, self.activation, obs_rank=self.obs_rank)
        self.gru = GRU(self.gru_size)
        self.actor = MLP(self.head_sizes, self.activation, self.action_dim, 0.01)
        self.critic = MLP(self.head_sizes, self.activation, 1, 1.0)
        if self.continuous:
            self.log_std = self.param(
                "log_std", lambda _, shape: jnp.full(shape, self.init_log_std), (self.action_dim,)
            )

    def __call__(self, carry, obs, reset):
        """One step: ``(carry, obs, reset) -> (new carry, distribution, value)``."""
        carry = self.recur(carry, self.encode(obs), reset)
        dist, value = self.heads(carry)
        return carry, dist, value

    def encode(self, obs):
        return self.gru.project(self.encoder(obs))

    def recur(self, carry, projected_obs, reset):
        # A new episode starts from the zero state, whatever the previous episode left.
        carry = jnp.where(reset[..., None], jnp.zeros_like(carry), carry)
        return self.gru.step(carry, projected_obs)

    def heads(self, hidden):
        out = self.actor(hidden)
        if self.continuous:
            dist = DiagGaussian(out, jnp.broadcast_to(self.log_std, out.shape))
        else:
            dist = Categorical(out)
        return dist, self.critic(hidden).squeeze(-1)


def unroll(network: RecurrentActorCritic, params, carry, obs, reset):
    """Run the network over sequences: ``obs [T, B, ...]``, ``reset [T, B]``, ``carry [B, H]``.

    Returns ``(last carry, distribution [T, B], value [T, B])``. Step ``t`` gives
    the same result as calling the network on ``obs[t]`` with the carry left by
    step ``t - 1`` -- the learning phase replays a rollout with it.
    """
    projected = network.apply(params, obs, method=RecurrentActorCritic.encode)

    def step(h, inputs):
        h = network.apply(params, h, *inputs, method=RecurrentActorCritic.recur)
        return h, h

    carry, hidden = jax.lax.scan(step, carry, (projected, reset))
    dist, value = network.apply(params, hidden, method=RecurrentActorCritic.heads)
    return carry, dist, value


# --------------------------------------------------------------------------- running statistics


class RunningStats(NamedTuple):
    """Running mean and variance over batches (Chan et al.'s pairwise combination)."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape) -> "RunningStats":
        return cls(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4))

    def update(self, batch: jax.Array) -> "RunningStats":
        n = batch.shape[0]
        batch_mean, batch_var = batch.mean(0), batch.var(0)
        count = self.count + n
        shift = batch_mean - self.mean
        sum_sq = self.var * self.count + batch_var * n + shift**2 * self.count * n / count
        return RunningStats(self.mean + shift * n / count, sum_sq / count, count)


def normalize(stats: RunningStats, x: jax.Array, clip: float) -> jax.Array:
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)


# --------------------------------------------------------------------------- returns and losses


def gae(rewards, values, next_values, terminated, done, gamma, lam):
    """GAE(lambda) advantages and value targets for a ``[T, ...]`` rollout.

    ``next_values[t]`` estimates the state actually reached by step ``t`` (the
    observation before any auto-reset). A termination multiplies it by zero; a
    truncation keeps it, so time limits are bootstrapped. ``done`` (either
    kind of ending) stops advantages from flowing back into the previous episode.
    """
    td_errors = rewards + gamma * (1.0 - terminated) * next_values - values

    def accumulate(following, inputs):
        td_error, done_t = inputs
        advantage = td_error + gamma * lam * (1.0 - done_t) * following
        return advantage, advantage

    _, advantages = jax.lax.scan(accumulate, jnp.zeros_like(td_errors[0]), (td_errors, done), reverse=True)
    return advantages, advantages + values


def ppo_loss_terms(config: Config, log_prob, old_log_prob, entropy, value, old_value, advantages, targets):
    """Clipped policy surrogate, (optionally clipped) value loss and entropy, averaged over a minibatch."""
    if config.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = jnp.exp(log_prob - old_log_prob)
    surrogate = jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - config.clip_eps, 1 + config.clip_eps) * advantages)
    policy_loss = -surrogate.mean()
    value_error = (value - targets) ** 2
    if config.clip_value_loss:
        clipped = old_value + jnp.clip(value - old_value, -config.vf_clip_eps, config.vf_clip_eps)
        value_error = jnp.maximum(value_error, (clipped - targets) ** 2)
    value_loss = 0.5 * value_error.mean()
    entropy = entropy.mean()
    total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return total, {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": ((ratio - 1.0) - jnp.log(ratio)).mean(),
        "clip_fraction": (jnp.abs(ratio - 1.0) > config.clip_eps).mean(),
    }


# --------------------------------------------------------------------------- training state


class Transition(NamedTuple):
    obs: jax.Array  # observation the action was chosen on (normalised if configured)
    reset: jax.Array  # obs begins a new episode
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array  # observation reached by the step, before any auto-reset
    hidden: jax.Array  # GRU state after reading obs: the memory final_obs should be read with


class Policy(NamedTuple):
    """What acting needs: network parameters and the observation statistics."""

    params: Any
    obs_stats: RunningStats


class TrainState(struct.PyTreeNode):
    params: Any
    opt_state: Any
    env_state: Any
    obs: jax.Array
    carry: jax.Array  # per env GRU state, [num_envs, gru_size], before reading obs
    reset: jax.Array  # per env: obs begins a new episode (so carry is ignored)
    obs_stats: RunningStats
    reward_stats: RunningStats
    discounted_return: jax.Array  # per env, for reward scaling
    episode_return: jax.Array  # per env, running undiscounted return
    last_episode_return: jax.Array  # per env, return of the last finished episode
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array

    @property
    def policy(self) -> Policy:
        return Policy(self.params, self.obs_stats)


class Agent(NamedTuple):
    init: Callable  # key -> TrainState
    update: Callable  # TrainState -> (TrainState, metrics)
    act: Callable  # (Policy, carry, obs, reset, key, greedy) -> (carry, action)
    value: Callable  # (Policy, carry, obs, reset) -> (carry, value)
    init_carry: Callable  # batch_size -> zero carry [batch_size, gru_size] ([gru_size] for None)


def action_spec(env, env_params):
    """(action_dim, continuous, low, high) of a gymnax action space."""
    space = env.action_space(env_params)
    if hasattr(space, "n"):
        return int(space.n), False, None, None
    low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape)
    high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape)
    return int(np.prod(space.shape)), True, low, high


def make(config: Config, env, env_params) -> Agent:
    """Build recurrent PPO's pure functions for one environment."""
    action_dim, continuous, low, high = action_spec(env, env_params)
    obs_shape = env.observation_space(env_params).shape
    network = RecurrentActorCritic(
        action_dim, continuous, tuple(config.hidden_sizes), config.gru_size, tuple(config.head_sizes),
        config.activation, config.init_log_std, len(obs_shape),
    )
    example = (jnp.zeros(config.gru_size), jnp.zeros(obs_shape), jnp.zeros((), bool))
    # The optimiser sees one flat parameter vector (fewer, fused kernels);
    # the network is applied to the unflattened tree.
    template = jax.eval_shape(network.init, jax.random.PRNGKey(0), *example)
    _, unravel = ravel_pytree(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), template))

    updates_per_iteration = config.num_epochs * config.num_minibatches
    envs_per_minibatch = config.num_envs // config.num_minibatches

    def learning_rate(count):
        if not config.anneal_lr:
            return config.lr
        return config.lr * jnp.maximum(1.0 - (count // updates_per_iteration) / config.num_updates, 0.0)  # 0 past the end

    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=config.adam_eps),
    )

    def prepare_obs(obs_stats, obs):
        if config.normalize_observations:
            return normalize(obs_stats, obs, config.clip_observations)
        return obs

    def to_env_action(action):
        return jnp.clip(action, low, high) if continuous else action

    def init_carry(batch_size: int | None = None):
        """Zero GRU state for ``batch_size`` environments (unbatched for ``None``)."""
        shape = (config.gru_size,) if batch_size is None else (batch_size, config.gru_size)
        return jnp.zeros(shape, jnp.float32)

    def act(policy: Policy, carry, obs, reset, key, greedy: bool = False):
        """Read ``obs`` (after zeroing the carry where ``reset``) and pick an action; returns ``(carry, action)``."""
        carry, dist, _ = network.apply(
            unravel(policy.params), carry, prepare_obs(policy.obs_stats, obs), jnp.asarray(reset, bool)
        )
        action = dist.mode() if greedy else dist.sample(seed=key)
        return carry, to_env_action(action)

    def value(policy: Policy, carry, obs, reset):
        """The critic's estimate after reading ``obs``; returns ``(carry, value)``."""
        carry, _, v = network.apply(
            unravel(policy.params), carry, prepare_obs(policy.obs_stats, obs), jnp.asarray(reset, bool)
        )
        return carry, v

    def init(key) -> TrainState:
        net_key, env_key, key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(env_key, config.num_envs), env_params)
        params, _ = ravel_pytree(network.init(net_key, *example))
        zeros = jnp.zeros(config.num_envs)
        obs_stats = RunningStats.create(obs_shape)
        return TrainState(
            params=params,
            opt_state=optimizer.init(params),
            env_state=env_state,
            obs=obs,
            carry=init_carry(config.num_envs),
            reset=jnp.ones(config.num_envs, bool),
            obs_stats=obs_stats.update(obs) if config.normalize_observations else obs_stats,
            reward_stats=RunningStats.create(()),
            discounted_return=zeros,
            episode_return=zeros,
            last_episode_return=zeros,
            key=key,
            update_step=jnp.asarray(0, jnp.int32),
            env_steps=jnp.asarray(0, jnp.int32),
        )

    def collect(state: TrainState, params):
        """One rollout of ``num_steps``; ``params`` is the unflattened tree, fixed during the rollout."""

        def env_step(state: TrainState, _):
            key, action_key, step_key = jax.random.split(state.key, 3)
            obs_in = prepare_obs(state.obs_stats, state.obs)
            hidden, dist, value = network.apply(params, state.carry, obs_in, state.reset)
            action = dist.sample(seed=action_key)
            log_prob = dist.log_prob(action)
            next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, config.num_envs), state.env_state, to_env_action(action), env_params
            )
            reward = reward.astype(jnp.float32)
            terminated = terminated.astype(jnp.float32)
            done = jnp.logical_or(terminated, truncated)
            done_f = done.astype(jnp.float32)

            obs_stats = state.obs_stats.update(next_obs) if config.normalize_observations else state.obs_stats
            reward_stats, discounted_return = state.reward_stats, state.discounted_return
            train_reward = reward
            if config.normalize_rewards:
                discounted_return = discounted_return * config.gamma + reward
                reward_stats = reward_stats.update(discounted_return)
                train_reward = reward / jnp.sqrt(reward_stats.var + 1e-8)
                discounted_return = discounted_return * (1.0 - done_f)

            episode_return = state.episode_return + reward
            transition = Transition(
                obs=obs_in, reset=state.reset, action=action, log_prob=log_prob, value=value, reward=train_reward,
                terminated=terminated, done=done_f, final_obs=prepare_obs(obs_stats, info["final_observation"]),
                hidden=hidden,
            )
            # The carry is kept as is even where the episode ended: ``reset``
            # tells the next step (and the replay) to start from zeros instead.
            state = state.replace(
                env_state=env_state,
                obs=next_obs,
                carry=hidden,
                reset=done,
                obs_stats=obs_stats,
                reward_stats=reward_stats,
                discounted_return=discounted_return,
                episode_return=episode_return * (1.0 - done_f),
                last_episode_return=jnp.where(done, episode_return, state.last_episode_return),
                key=key,
            )
            return state, transition

        return jax.lax.scan(env_step, state, None, config.num_steps)

    def minibatch_loss(flat_params, minibatch):
        carry, obs, reset, action, old_log_prob, old_value, advantages, targets = minibatch
        _, dist, value = unroll(network, unravel(flat_params), carry, obs, reset)
        return ppo_loss_terms(
            config, dist.log_prob(action), old_log_prob, dist.entropy(), value, old_value, advantages, targets
        )

    grad_fn = jax.value_and_grad(minibatch_loss, has_aux=True)

    def learn_epoch(carry, _):
        params, opt_state, batch, key = carry
        key, perm_key = jax.random.split(key)
        # Shuffle environments, not time steps: each minibatch is a set of whole
        # sequences with the GRU state they started from.
        envs = jax.random.permutation(perm_key, config.num_envs).reshape(config.num_minibatches, envs_per_minibatch)
        start_carry, sequences = batch
        minibatches = (start_carry[envs], *(jnp.moveaxis(x[:, envs], 1, 0) for x in sequences))

        def learn_minibatch(carry, minibatch):
            params, opt_state = carry
            (loss, terms), grads = grad_fn(params, minibatch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params, opt_state), {"loss": loss, "grad_norm": optax.tree.norm(grads), **terms}

        (params, opt_state), metrics = jax.lax.scan(learn_minibatch, (params, opt_state), minibatches)
        return (params, opt_state, batch, key), metrics

    def update(state: TrainState):
        params = unravel(state.params)
        start_carry = state.carry  # replay starts here (zeroed where traj.reset[0])
        state, traj = collect(state, params)

        # Bootstrap values. final_obs[t] is the observation that step t reached,
        # in the same episode as obs[t]; the memory that goes with it is the GRU
        # state after reading obs[t] (traj.hidden[t]), never a reset state --
        # the episode did not restart for final_obs, only the environment did.
        # So read final_obs with that carry and reset=False. Where the episode
        # continues, final_obs[t] == obs[t + 1] and this equals traj.value[t + 1];
        # on termination the value is multiplied by zero in gae; on truncation it
        # is the bootstrap. One batched step covers every [T, B] entry.
        _, _, next_values = network.apply(
            params, traj.hidden, traj.final_obs, jnp.zeros(traj.done.shape, bool)
        )
        advantages, targets = gae(
            traj.reward, traj.value, next_values, traj.terminated, traj.done, config.gamma, config.gae_lambda
        )
        sequences = (traj.obs, traj.reset, traj.action, traj.log_prob, traj.value, advantages, targets)
        key, learn_key = jax.random.split(state.key)
        (flat_params, opt_state, _, _), metrics = jax.lax.scan(
            learn_epoch, (state.params, state.opt_state, (start_carry, sequences), learn_key), None, config.num_epochs
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        state = state.replace(
            params=flat_params,
            opt_state=opt_state,
            key=key,
            update_step=state.update_step + 1,
            env_steps=state.env_steps + config.batch_size,
        )
        metrics["train_return"] = state.last_episode_return.mean()
        metrics["learning_rate"] = learning_rate(state.update_step * updates_per_iteration - 1)
        return state, metrics

    return Agent(init, update, act, value, init_carry)


def train(config: Config, env, env_params, key, num_updates: int | None = None):
    """Train from scratch: ``init`` then ``num_updates`` (default: all) updates under ``lax.scan``."""
    agent = make(config, env, env_params)

    def run(key):
        state = agent.init(key)
        return jax.lax.scan(lambda s, _: agent.update(s), state, None, num_updates or config.num_updates)

    return jax.jit(run)(key)


def _cli():
    import argparse
    import os
    import time

    # Works around a hang of jaxlib 0.10's CPU runtime on some vmapped programs; added to any
    # XLA_FLAGS the user already set (unless they name the scheduler themselves).
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_enable_concurrency_optimized_scheduler" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_enable_concurrency_optimized_scheduler=false".strip()

    parser = argparse.ArgumentParser(description="Train recurrent PPO on a gymnax environment.")
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env", choices=["MemoryChain-bsuite", "CartPole-v1"], default="MemoryChain-bsuite")
    args = parser.parse_args()
    if args.env == "CartPole-v1":
        from gymnax.environments.classic_control.cartpole import CartPole

        env = CartPole()
        config = Config(total_timesteps=args.timesteps, lr=2.5e-3, ent_coef=0.0, gamma=0.98, gae_lambda=0.9)
    else:
        # Reward +-1 on the 6th step for repeating the cue seen on the first
        # two: feed-forward policies average 0, a memory gets 1.
        from gymnax.environments.bsuite.memory_chain import MemoryChain

        env = MemoryChain()
        config = Config(total_timesteps=args.timesteps)
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
