"""Proximal Policy Optimization (PPO) as pure, jittable functions in one file.

Vendorable: this file imports only jax, flax, optax and numpy. Copy it
into your project and run ``python ppo.py`` to train CartPole.

Shape of the API (shared by every rlx agent):

* ``Config`` -- a ``flax.struct`` dataclass. Numeric hyper-parameters are pytree
  leaves, so one compiled program can ``vmap`` over them; fields that decide
  array shapes or program structure are static.
* ``make(config, env, env_params)`` -> ``Agent`` of pure functions:
  ``init(key) -> state``, ``update(state) -> (state, metrics)`` (collect one
  rollout, then learn from it) and ``act(policy, obs, key, greedy)``.
* ``train(config, env, env_params, key)`` -- ``init`` plus a ``lax.scan`` of
  ``update``; what a user who vendors the file calls.

Environments follow the gymnax 1.0 API: ``step`` returns ``(obs, state, reward,
terminated, truncated, info)`` with auto-reset and ``info["final_observation"]``
holding the observation before the reset, so truncated episodes are
bootstrapped from the value of their real last state.
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
    """A dataclass field that is part of the program's structure, not a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """PPO hyper-parameters.

    Numeric fields are traced leaves (sweepable under ``vmap`` without
    recompiling); ``static`` fields shape the program.
    """

    lr: float = 2.5e-4
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
    num_envs: int = static(4)
    num_steps: int = static(128)
    num_epochs: int = static(4)
    num_minibatches: int = static(4)
    hidden_sizes: tuple = static((64, 64))
    activation: str = static("tanh")
    torso: str = static("mlp")
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
    """Raise ``ValueError("field=value: rule")`` for the first invalid field.

    Runs in Python on concrete values, before anything is traced.
    """
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
            config.num_minibatches >= 1 and config.batch_size % config.num_minibatches == 0,
            f"must divide the batch num_envs*num_steps={config.batch_size}",
        ),
        (
            "total_timesteps",
            config.num_envs >= 1 and config.num_steps >= 1 and config.num_updates >= 1,
            f"must be >= one batch (num_envs*num_steps={config.batch_size})",
        ),
        ("hidden_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.hidden_sizes),
         "every width must be an integer >= 1"),
        ("activation", config.activation in ACTIVATIONS, f"must be one of {sorted(ACTIVATIONS)}"),
        ("torso", config.torso in TORSOS, f"must be one of {list(TORSOS)}"),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


# --------------------------------------------------------------------------- distributions
# Two small policy distributions instead of distrax: with distrax (TFP's JAX
# substrate underneath) PPO's update ran at about 80k env steps/s on a 2-core
# CPU, with these at about 125k, and the import is 0.75 s shorter.


class Categorical(NamedTuple):
    """Discrete policy over the last axis of ``logits``."""

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


class DiagGaussian(NamedTuple):
    """Gaussian policy with independent action dimensions (last axis)."""

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


TORSOS = ("mlp", "cnn")


class Torso(nn.Module):
    """Turns observations of rank ``obs_rank`` into feature vectors.

    ``mlp`` flattens them (vectors pass through; MinAtar's 10x10xC grids become
    400-vectors); ``cnn`` runs one 2x2 convolution of 32 channels and a 2x2
    average pooling over HxWxC grids first (pgx's MinAtar PPO network), both
    written as matrix products and reshapes, which XLA's CPU backend runs far
    faster than its convolution and pooling ops.
    """

    kind: str
    obs_rank: int

    @nn.compact
    def __call__(self, obs):
        batch_shape = obs.shape[: obs.ndim - self.obs_rank]
        x = obs.astype(jnp.float32)
        if self.kind == "cnn":
            x = x.reshape((-1,) + obs.shape[-3:])
            # A 2x2 convolution ('SAME': a zero row and column appended) as a dense layer on each
            # cell's 2x2 patch. The ppo_minatar preset trains at ~4k env steps/s on one CPU core
            # like this, at 612 with nn.Conv and nn.avg_pool (the MLP torso: 16k).
            padded = jnp.pad(x, ((0, 0), (0, 1), (0, 1), (0, 0)))
            height, width = x.shape[1:3]
            patches = jnp.concatenate([padded[:, i:i + height, j:j + width] for i in (0, 1) for j in (0, 1)], -1)
            x = nn.relu(nn.Dense(32, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(patches))
            half_h, half_w = height // 2, width // 2  # 2x2 average pooling (an odd last row/column is dropped)
            x = x[:, :2 * half_h, :2 * half_w].reshape(-1, half_h, 2, half_w, 2, x.shape[-1]).mean((2, 4))
        return x.reshape(batch_shape + (-1,))


class MLP(nn.Module):
    """Orthogonally initialised MLP with a linear head of ``out_dim`` units, after a ``Torso``."""

    hidden_sizes: tuple
    activation: str
    out_dim: int
    out_scale: float
    torso: str = "mlp"
    obs_rank: int = 1

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        x = Torso(self.torso, self.obs_rank)(x)
        for width in self.hidden_sizes:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out_dim, kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


class ActorCritic(nn.Module):
    """Separate actor and critic networks; Gaussian actors keep a state-independent log std."""

    action_dim: int
    continuous: bool
    hidden_sizes: tuple
    activation: str
    init_log_std: float = 0.0
    torso: str = "mlp"
    obs_rank: int = 1

    def setup(self):
        self.actor = MLP(self.hidden_sizes, self.activation, self.action_dim, 0.01, self.torso, self.obs_rank)
        self.critic = MLP(self.hidden_sizes, self.activation, 1, 1.0, self.torso, self.obs_rank)
        if self.continuous:
            self.log_std = self.param(
                "log_std", lambda _, shape: jnp.full(shape, self.init_log_std), (self.action_dim,)
            )

    def __call__(self, obs):
        return self.policy(obs), self.value(obs)

    def policy(self, obs):
        out = self.actor(obs)
        if self.continuous:
            return DiagGaussian(out, jnp.broadcast_to(self.log_std, out.shape))
        return Categorical(out)

    def value(self, obs):
        return self.critic(obs).squeeze(-1)


# --------------------------------------------------------------------------- running statistics


class RunningStats(NamedTuple):
    """Mean and variance of a stream of batches (parallel Welford update)."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape) -> "RunningStats":
        return cls(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4))

    def update(self, batch: jax.Array) -> "RunningStats":
        batch_mean, batch_var, n = batch.mean(0), batch.var(0), batch.shape[0]
        total = self.count + n
        delta = batch_mean - self.mean
        mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        return RunningStats(mean, m2 / total, total)


def normalize(stats: RunningStats, x: jax.Array, clip: float) -> jax.Array:
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)


# --------------------------------------------------------------------------- returns and losses


def gae(rewards, values, next_values, terminated, done, gamma, lam):
    """Generalised advantage estimates and value targets over a ``[T, ...]`` rollout.

    ``next_values[t]`` is the value of the true next state of step ``t`` (the
    pre-reset observation), so truncated episodes bootstrap from it while
    ``terminated`` cuts the bootstrap; ``done`` (terminated or truncated) stops
    the advantage from leaking across episode boundaries.
    """
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values

    def backward(carry, step):
        delta, done_t = step
        carry = delta + gamma * lam * (1.0 - done_t) * carry
        return carry, carry

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, done), reverse=True)
    return advantages, advantages + values


# Averaged over an update's minibatches. They are summed as one packed vector in the scan's
# carry: as separate stacked scan outputs they cost about 8% of the steps/s on a CPU.
LEARN_METRICS = ("loss", "grad_norm", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")


def ppo_loss_terms(config: Config, log_prob, old_log_prob, entropy, value, old_value, advantages, targets):
    """Clipped surrogate, (optionally clipped) value loss and entropy for one minibatch."""
    if config.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = jnp.exp(log_prob - old_log_prob)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
    policy_loss = -jnp.minimum(ratio * advantages, clipped_ratio * advantages).mean()
    value_error = (value - targets) ** 2
    if config.clip_value_loss:
        clipped_value = old_value + jnp.clip(value - old_value, -config.vf_clip_eps, config.vf_clip_eps)
        value_error = jnp.maximum(value_error, (clipped_value - targets) ** 2)
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
    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array


class Policy(NamedTuple):
    """What acting needs: network parameters and the observation statistics."""

    params: Any
    obs_stats: RunningStats


class TrainState(struct.PyTreeNode):
    params: Any
    opt_state: Any
    env_state: Any
    obs: jax.Array
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
    act: Callable  # (Policy, obs, key, greedy) -> action
    value: Callable  # (Policy, obs) -> state value


def action_spec(env, env_params):
    """(action_dim, continuous, low, high) from a gymnax action space."""
    space = env.action_space(env_params)
    if hasattr(space, "n"):
        return int(space.n), False, None, None
    low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape)
    high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape)
    return int(np.prod(space.shape)), True, low, high


def validate_for_env(config: Config, env, env_params) -> None:
    """The check that needs the environment: a convolutional torso reads HxWxC observations."""
    obs_shape = env.observation_space(env_params).shape
    if config.torso == "cnn" and len(obs_shape) != 3:
        raise ValueError(f"torso='cnn': needs HxWxC observations, this environment's have shape {obs_shape}")


def make(config: Config, env, env_params) -> Agent:
    """Build PPO's pure functions for one environment."""
    validate_for_env(config, env, env_params)
    action_dim, continuous, low, high = action_spec(env, env_params)
    obs_shape = env.observation_space(env_params).shape
    network = ActorCritic(
        action_dim, continuous, tuple(config.hidden_sizes), config.activation, config.init_log_std,
        config.torso, len(obs_shape),
    )
    # Parameters live as one flat vector: the optimiser then runs a handful of
    # fused kernels instead of a few per layer, which halves compile time on CPU.
    template = jax.eval_shape(network.init, jax.random.PRNGKey(0), jnp.zeros(obs_shape))
    _, unravel = ravel_pytree(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), template))

    def apply(flat_params, obs, method=None):
        return network.apply(unravel(flat_params), obs, method=method)

    updates_per_iteration = config.num_epochs * config.num_minibatches

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

    def act(policy: Policy, obs, key, greedy: bool = False):
        """Action for one observation (or a batch) under the current policy."""
        dist = apply(policy.params, prepare_obs(policy.obs_stats, obs), method=ActorCritic.policy)
        action = dist.mode() if greedy else dist.sample(seed=key)
        return to_env_action(action)

    def value(policy: Policy, obs):
        """The critic's estimate for an observation (or a batch)."""
        return apply(policy.params, prepare_obs(policy.obs_stats, obs), method=ActorCritic.value)

    def init(key) -> TrainState:
        net_key, env_key, key = jax.random.split(key, 3)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(env_key, config.num_envs), env_params)
        params, _ = ravel_pytree(network.init(net_key, jnp.zeros(obs_shape)))
        zeros = jnp.zeros(config.num_envs)
        return TrainState(
            params=params,
            opt_state=optimizer.init(params),
            env_state=env_state,
            obs=obs,
            obs_stats=RunningStats.create(obs_shape).update(obs) if config.normalize_observations else RunningStats.create(obs_shape),
            reward_stats=RunningStats.create(()),
            discounted_return=zeros,
            episode_return=zeros,
            last_episode_return=zeros,
            key=key,
            update_step=jnp.asarray(0, jnp.int32),
            env_steps=jnp.asarray(0, jnp.int32),
        )

    def env_step(state: TrainState, _):
        key, action_key, step_key = jax.random.split(state.key, 3)
        obs_in = prepare_obs(state.obs_stats, state.obs)
        dist, value = apply(state.params, obs_in)
        action = dist.sample(seed=action_key)
        log_prob = dist.log_prob(action)
        step_keys = jax.random.split(step_key, config.num_envs)
        next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            step_keys, state.env_state, to_env_action(action), env_params
        )
        reward = reward.astype(jnp.float32)
        terminated = terminated.astype(jnp.float32)
        done = jnp.logical_or(terminated, truncated).astype(jnp.float32)
        final_obs = info["final_observation"]

        obs_stats = state.obs_stats.update(next_obs) if config.normalize_observations else state.obs_stats
        reward_stats, discounted_return = state.reward_stats, state.discounted_return
        train_reward = reward
        if config.normalize_rewards:
            discounted_return = discounted_return * config.gamma + reward
            reward_stats = reward_stats.update(discounted_return)
            train_reward = reward / jnp.sqrt(reward_stats.var + 1e-8)
            discounted_return = discounted_return * (1.0 - done)

        episode_return = state.episode_return + reward
        transition = Transition(
            obs_in, action, log_prob, value, train_reward, terminated, done, prepare_obs(obs_stats, final_obs)
        )
        state = state.replace(
            env_state=env_state,
            obs=next_obs,
            obs_stats=obs_stats,
            reward_stats=reward_stats,
            discounted_return=discounted_return,
            episode_return=episode_return * (1.0 - done),
            last_episode_return=jnp.where(done > 0, episode_return, state.last_episode_return),
            key=key,
        )
        return state, transition

    def minibatch_loss(params, batch):
        obs, action, old_log_prob, old_value, advantages, targets = batch
        dist, value = apply(params, obs)
        return ppo_loss_terms(
            config, dist.log_prob(action), old_log_prob, dist.entropy(), value, old_value, advantages, targets
        )

    grad_fn = jax.value_and_grad(minibatch_loss, has_aux=True)

    def learn_epoch(carry, _):
        params, opt_state, totals, batch, key = carry
        key, perm_key = jax.random.split(key)
        permutation = jax.random.permutation(perm_key, config.batch_size)
        minibatches = jax.tree.map(
            lambda x: x[permutation].reshape((config.num_minibatches, -1) + x.shape[1:]), batch
        )

        def learn_minibatch(carry, minibatch):
            params, opt_state, totals = carry
            (loss, terms), grads = grad_fn(params, minibatch)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), **terms}
            return (params, opt_state, totals + jnp.stack([metrics[name] for name in LEARN_METRICS])), None

        (params, opt_state, totals), _ = jax.lax.scan(learn_minibatch, (params, opt_state, totals), minibatches)
        return (params, opt_state, totals, batch, key), None

    def update(state: TrainState):
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)
        next_values = apply(state.params, traj.final_obs, method=ActorCritic.value)
        advantages, targets = gae(
            traj.reward, traj.value, next_values, traj.terminated, traj.done, config.gamma, config.gae_lambda
        )
        batch = (traj.obs, traj.action, traj.log_prob, traj.value, advantages, targets)
        batch = jax.tree.map(lambda x: x.reshape((config.batch_size,) + x.shape[2:]), batch)
        key, learn_key = jax.random.split(state.key)
        totals = jnp.zeros(len(LEARN_METRICS))
        (params, opt_state, totals, _, _), _ = jax.lax.scan(
            learn_epoch, (state.params, state.opt_state, totals, batch, learn_key), None, config.num_epochs
        )
        metrics = dict(zip(LEARN_METRICS, totals / updates_per_iteration))
        state = state.replace(
            params=params,
            opt_state=opt_state,
            key=key,
            update_step=state.update_step + 1,
            env_steps=state.env_steps + config.batch_size,
        )
        metrics["train_return"] = state.last_episode_return.mean()
        metrics["learning_rate"] = learning_rate(state.update_step * updates_per_iteration - 1)
        return state, metrics

    return Agent(init, update, act, value)


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

    from gymnax.environments.classic_control.cartpole import CartPole

    parser = argparse.ArgumentParser(description="Train PPO on gymnax CartPole-v1.")
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = CartPole()
    config = Config(
        total_timesteps=args.timesteps, num_envs=8, num_steps=64, lr=2.5e-3, ent_coef=0.0, gamma=0.98, gae_lambda=0.9
    )
    validate(config)
    start = time.perf_counter()
    state, metrics = train(config, env, env.default_params, jax.random.PRNGKey(args.seed))
    returns = np.asarray(metrics["train_return"])
    step = max(1, len(returns) // 10)
    for i in range(step - 1, len(returns), step):
        print(f"update {i + 1:5d}  env steps {(i + 1) * config.batch_size:8d}  train return {returns[i]:7.1f}")
    print(f"final train return {returns[-1]:.1f} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    _cli()
