"""Dyna-style model-based PPO: PPO trained on rollouts imagined by a learned dynamics ensemble, in one file.

Vendorable: this file imports only jax, flax, optax and numpy. Copy it into
your project and run ``python dyna_ppo.py`` to train CartPole from a few
thousand real environment steps.

Each ``update``:

1. collects ``real_steps_per_update = num_envs * num_steps`` real steps with
   the current policy and writes the transitions ``(obs, action, reward,
   terminated, next_obs)`` into a ring buffer of ``buffer_size`` transitions
   kept in the training state (``next_obs`` is the pre-reset observation, so
   truncations are not terminations); running mean/variance statistics of the
   observations, the observation changes and the rewards are updated with them;
2. trains an ensemble of ``ensemble_size`` MLP dynamics models. Each member
   maps the normalised observation and the action (one-hot when discrete) to the
   normalised next-observation *change*, the normalised reward and a termination
   logit; the loss is the squared error of the first two plus ``termination_coef``
   times the logistic loss of the third. Every gradient step gives each member
   its own minibatch of ``model_batch_size`` transitions drawn uniformly from the
   buffer, except the newest ``holdout_size`` transitions of this update's batch,
   on which the one-step error is then measured (``model_error_1step``);
3. branches ``num_branches`` imagined rollouts of ``horizon`` steps from
   observations drawn uniformly from the buffer (``imagine_with``): the current
   policy samples the actions, and at every step each branch is advanced by a
   uniformly random ensemble member. A predicted termination (logit > 0) ends a
   branch: its later steps are masked out. GAE runs over each branch and the
   value of the state reached after ``horizon`` steps is bootstrapped;
4. runs ``num_epochs`` passes of clipped PPO over the imagined steps together
   with this update's real rollout (with true rewards and GAE), split into the
   same number of minibatches each; the loss of a minibatch is
   ``real_fraction * L_real + (1 - real_fraction) * L_imagined``.

``train_ratio`` is the one knob for how much learning each real step buys: the
number of gradient steps per real environment step, applied to the model and to
the policy alike. An update makes ``grad_steps = train_ratio *
real_steps_per_update`` gradient steps on the dynamics ensemble (every member
steps once on its own minibatch) and ``grad_steps`` PPO minibatch steps
(``num_epochs`` epochs of ``grad_steps / num_epochs`` minibatches); it must come
out as a whole multiple of ``num_epochs``. The ``train_ratio`` metric logs the
ratio in use (both kinds of step together count once, i.e. it is
``grad_steps / real_steps_per_update``).

Metrics per update (scalars): PPO's ``loss``, ``policy_loss``,
``value_loss``, ``entropy``, ``approx_kl``, ``clip_fraction`` and ``grad_norm``
(each mixed between real and imagined data like the loss), ``learning_rate``,
``train_return`` (true undiscounted return of the last finished real episode,
mean over envs, as in ``ppo.py``); ``model_loss`` (ensemble training loss,
mean over members and this update's steps); ``model_error_1step`` (mean squared
error of the ensemble-mean next-observation prediction on the held-out slice,
in units of the running standard deviation of the observation change, so 1 is
no better than predicting the mean change); ``reward_mse`` (ensemble-mean
reward prediction, raw reward units, same slice); ``termination_accuracy``
(same slice); ``imagined_return`` (undiscounted sum of imagined rewards over a
branch's live steps, mean over branches: at most ``horizon`` times the largest
reward); ``imagined_length`` (live steps per branch, mean); ``train_ratio``.

Shape of the API (shared by every rlx agent): ``Config`` (a ``flax.struct``
dataclass; numeric fields are pytree leaves, ``static`` fields shape the
program), ``validate(config)``, ``make(config, env, env_params) -> Agent(init,
update, act, value, model_step, imagine)`` and ``train(config, env, env_params, key)``;
``state.policy`` is what ``act`` needs, as in ``ppo.py``, and ``state.world_model``
(ensemble parameters and normalisation statistics) what imagination needs:
``agent.imagine(state.world_model, state.policy, start_obs, horizon, key)``.
Underneath, ``imagine_with`` is a module-level function that runs any batched
model and policy; the agent's own ``model_step(model_params, model_stats, obs,
action, key)`` is the learned ensemble's step (each row through a random member). Environments
follow the gymnax 1.0 API (``step`` returns ``obs, state, reward, terminated,
truncated, info`` with auto-reset and ``info["final_observation"]``), with
vector observations.
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
# Held-out metrics are NaN with ``holdout_size=0`` (nothing held out); a training loop should not treat that
# as divergence.
METRICS_MAY_BE_NAN = ("model_error_1step", "reward_mse", "termination_accuracy")


def static(default):
    """A dataclass field that is part of the program's structure, not a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """Dyna-PPO hyper-parameters.

    PPO's fields are those of ``ppo.Config`` (``num_minibatches`` follows from
    ``train_ratio``, see the module docstring). Model and imagination:

    * ``model_lr`` -- Adam step size of the dynamics ensemble;
      ``model_hidden_sizes`` / ``model_activation`` / ``ensemble_size`` -- its
      MLPs; ``model_batch_size`` transitions per member and gradient step;
      ``termination_coef`` / ``reward_coef`` weigh the termination and reward
      terms of its loss against the observation-change term;
      ``balance_terminations`` weighs terminal and other transitions half each
      in the termination loss (by the buffer's termination rate): terminations
      are rare, and a model that misses them imagines a world without failure.
    * ``buffer_size`` -- ring buffer capacity in real transitions;
      ``holdout_size`` -- newest transitions of each update's batch kept out of
      that update's model training to measure ``model_error_1step``.
    * ``num_branches`` imagined rollouts of ``horizon`` steps per update
      (``num_branches`` a multiple of ``ensemble_size``: each step, a random
      permutation splits the branches evenly between the members).
    * ``start_window`` -- branch only from the newest ``start_window`` real
      transitions (0: from the whole buffer).
    * ``real_fraction`` -- weight in [0, 1] of the real-data PPO loss.
    * ``train_ratio`` -- gradient steps on the model, and on the policy, per
      real environment step.

    ``clip_value_loss`` is off by default (unlike ``ppo.py``): clipping moves a
    value at most ``vf_clip_eps`` per update, and the critic here must carry the
    return beyond the imagination horizon (CartPole values reach ~50). With it on,
    greedy CartPole returns peaked near 450 after ~6k real steps and then decayed
    (5 seeds); with it off every seed reached 475 (horizon 20).
    """

    lr: float = 1e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_clip_eps: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5
    init_log_std: float = 0.0
    model_lr: float = 1e-3
    termination_coef: float = 1.0
    reward_coef: float = 1.0
    real_fraction: float = 0.1

    total_timesteps: int = static(20_480)
    num_envs: int = static(4)
    num_steps: int = static(32)
    num_epochs: int = static(4)
    train_ratio: float = static(0.25)
    hidden_sizes: tuple = static((64, 64))
    activation: str = static("tanh")
    anneal_lr: bool = static(True)
    clip_value_loss: bool = static(False)
    normalize_advantages: bool = static(True)
    normalize_observations: bool = static(False)
    clip_observations: float = static(10.0)

    balance_terminations: bool = static(False)
    ensemble_size: int = static(5)
    model_hidden_sizes: tuple = static((200, 200))
    model_activation: str = static("swish")
    model_batch_size: int = static(256)
    buffer_size: int = static(100_000)
    holdout_size: int = static(16)
    horizon: int = static(20)
    num_branches: int = static(500)
    start_window: int = static(0)

    @property
    def real_steps_per_update(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def batch_size(self) -> int:
        """Real transitions per update (``real_steps_per_update``), the name ``ppo.Config`` uses."""
        return self.real_steps_per_update

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.real_steps_per_update

    @property
    def grad_steps(self) -> int:
        """Gradient steps per update on the model, and on the policy: ``train_ratio * real_steps_per_update``."""
        return int(round(self.train_ratio * self.real_steps_per_update))

    @property
    def num_minibatches(self) -> int:
        """PPO minibatches per epoch."""
        return self.grad_steps // max(self.num_epochs, 1)

    @property
    def imagined_batch_size(self) -> int:
        return self.num_branches * self.horizon


def validate(config: Config) -> None:
    """Raise ``ValueError("field=value: rule")`` for the first invalid field.

    Runs in Python on concrete values, before anything is traced.
    """
    real = config.real_steps_per_update
    steps = config.train_ratio * real
    steps_ok = config.num_epochs >= 1 and abs(steps - round(steps)) < 1e-6 and round(steps) >= config.num_epochs \
        and round(steps) % config.num_epochs == 0
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
        ("model_lr", config.model_lr > 0, "must be > 0"),
        ("termination_coef", config.termination_coef >= 0, "must be >= 0"),
        ("reward_coef", config.reward_coef >= 0, "must be >= 0"),
        ("real_fraction", 0 <= config.real_fraction <= 1, "must be in [0, 1]"),
        ("num_envs", config.num_envs >= 1, "must be >= 1"),
        ("num_steps", config.num_steps >= 1, "must be >= 1"),
        ("num_epochs", config.num_epochs >= 1, "must be >= 1"),
        (
            "total_timesteps",
            config.num_envs >= 1 and config.num_steps >= 1 and config.num_updates >= 1,
            f"must be >= one batch (real_steps_per_update=num_envs*num_steps={real})",
        ),
        ("train_ratio", config.train_ratio > 0, "must be > 0"),
        (
            "train_ratio",
            steps_ok,
            f"train_ratio*real_steps_per_update (={steps:g} gradient steps per update, real_steps_per_update="
            f"num_envs*num_steps={real}) must be a whole multiple of num_epochs={config.num_epochs}",
        ),
        ("hidden_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.hidden_sizes),
         "every width must be an integer >= 1"),
        ("activation", config.activation in ACTIVATIONS, f"must be one of {sorted(ACTIVATIONS)}"),
        ("ensemble_size", config.ensemble_size >= 1, "must be >= 1"),
        ("model_hidden_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.model_hidden_sizes),
         "every width must be an integer >= 1"),
        ("model_activation", config.model_activation in ACTIVATIONS, f"must be one of {sorted(ACTIVATIONS)}"),
        ("model_batch_size", config.model_batch_size >= 1, "must be >= 1"),
        ("holdout_size", 0 <= config.holdout_size < real, f"must be in [0, real_steps_per_update={real})"),
        ("buffer_size", config.buffer_size >= real, f"must be >= real_steps_per_update={real}"),
        ("horizon", config.horizon >= 1, "must be >= 1"),
        ("start_window", config.start_window >= 0, "must be >= 0 (0: the whole buffer)"),
        ("num_branches", config.num_branches >= 1, "must be >= 1"),
        (
            "num_branches",
            config.ensemble_size >= 1 and config.num_branches % config.ensemble_size == 0,
            f"must be a multiple of ensemble_size={config.ensemble_size}",
        ),
        (
            "num_branches",
            not steps_ok or config.num_branches * config.horizon >= config.num_minibatches,
            f"num_branches*horizon must be >= the {config.num_minibatches} PPO minibatches per epoch",
        ),
        (
            "train_ratio",  # a real minibatch of 0 rows has no loss, and of 1 row its normalised advantage is 0
            not steps_ok or real // max(config.num_minibatches, 1) >= 2,
            f"gives {config.num_minibatches} PPO minibatches per epoch (train_ratio*real_steps_per_update/num_epochs),"
            f" leaving {real // max(config.num_minibatches, 1)} of the {real} real steps in each: needs >= 2",
        ),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


def validate_for_env(config: Config, env, env_params) -> None:
    """The check that needs the environment: the dynamics model works on vector observations."""
    shape = env.observation_space(env_params).shape
    if len(shape) != 1:
        raise ValueError(f"name='dyna_ppo': needs vector observations; this environment's have shape {shape}")


# --------------------------------------------------------------------------- distributions


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


class MLP(nn.Module):
    """Orthogonally initialised MLP with a linear head of ``out_dim`` units (inputs flattened to vectors)."""

    hidden_sizes: tuple
    activation: str
    out_dim: int
    out_scale: float

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        x = x.astype(jnp.float32)
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

    def setup(self):
        self.actor = MLP(self.hidden_sizes, self.activation, self.action_dim, 0.01)
        self.critic = MLP(self.hidden_sizes, self.activation, 1, 1.0)
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

    @property
    def std(self) -> jax.Array:
        # A floor keeps near-constant quantities (CartPole's reward) from blowing up normalised targets.
        return jnp.sqrt(self.var + 1e-6)


def normalize(stats: RunningStats, x: jax.Array, clip: float) -> jax.Array:
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)


# --------------------------------------------------------------------------- returns and losses


def gae(rewards, values, next_values, terminated, done, gamma, lam):
    """Generalised advantage estimates and value targets over a ``[T, ...]`` rollout.

    ``next_values[t]`` is the value of the true next state of step ``t``, so
    truncated episodes (and imagined branches at their horizon) bootstrap from
    it while ``terminated`` cuts the bootstrap; ``done`` stops the advantage from
    leaking across episode boundaries.
    """
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values

    def backward(carry, step):
        delta, done_t = step
        carry = delta + gamma * lam * (1.0 - done_t) * carry
        return carry, carry

    _, advantages = jax.lax.scan(backward, jnp.zeros_like(deltas[0]), (deltas, done), reverse=True)
    return advantages, advantages + values


def ppo_loss_terms(config: Config, log_prob, old_log_prob, entropy, value, old_value, advantages, targets, weight):
    """Clipped surrogate, (optionally clipped) value loss and entropy, as ``weight``-weighted means.

    ``weight`` is 1 for a sample that counts and 0 for a masked one (an imagined
    step after a predicted termination); advantages are normalised over the
    counted samples.
    """
    total_weight = jnp.maximum(weight.sum(), 1e-8)

    def mean(x):
        return (x * weight).sum() / total_weight

    if config.normalize_advantages:
        centred = advantages - mean(advantages)
        advantages = centred / (jnp.sqrt(mean(centred**2)) + 1e-8)
    ratio = jnp.exp(log_prob - old_log_prob)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
    policy_loss = -mean(jnp.minimum(ratio * advantages, clipped_ratio * advantages))
    value_error = (value - targets) ** 2
    if config.clip_value_loss:
        clipped_value = old_value + jnp.clip(value - old_value, -config.vf_clip_eps, config.vf_clip_eps)
        value_error = jnp.maximum(value_error, (clipped_value - targets) ** 2)
    value_loss = 0.5 * mean(value_error)
    entropy = mean(entropy)
    total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return total, {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": mean((ratio - 1.0) - jnp.log(ratio)),
        "clip_fraction": mean((jnp.abs(ratio - 1.0) > config.clip_eps).astype(jnp.float32)),
    }


# --------------------------------------------------------------------------- imagination


class Imagined(NamedTuple):
    """An imagined rollout, every field ``[horizon, num_starts, ...]``.

    ``obs[t]`` is the observation step ``t`` acts on, ``next_obs[t]`` the
    model's prediction of where it leads; ``mask[t]`` is 1 while no earlier step
    of the branch terminated (the step happened) and 0 after. Once a branch
    terminates its observation stays frozen at the last live one; ``reward`` and
    ``terminated`` of masked steps are whatever the model says and must be
    ignored (multiply by ``mask``).
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    mask: jax.Array
    next_obs: jax.Array


def imagine_with(model_step, model_params, policy_fn, start_obs, horizon: int, key) -> Imagined:
    """Roll a learned model out for ``horizon`` steps from each of ``start_obs`` (``[N, ...]``), under ``lax.scan``.

    ``policy_fn(obs, key) -> action`` and ``model_step(model_params, obs,
    action, key) -> (next_obs, reward, termination_logit)`` both take the whole
    batch of ``N`` branches (``[N, ...]``) and treat its rows independently, so
    the step is vmapped over the starts by construction; batched step functions
    let an ensemble pick a random member per branch with one pass per member
    instead of running every member on every branch. A logit above 0 is a
    termination: that branch's later steps are masked out.
    """
    num_starts = start_obs.shape[0]

    def step(carry, key):
        obs, alive = carry
        act_key, model_key = jax.random.split(key)
        action = policy_fn(obs, act_key)
        next_obs, reward, logit = model_step(model_params, obs, action, model_key)
        terminated = (logit > 0).astype(jnp.float32)
        still_alive = alive * (1.0 - terminated)
        keep = still_alive.reshape((num_starts,) + (1,) * (obs.ndim - 1)) > 0
        out = Imagined(obs, action, reward.astype(jnp.float32), terminated, alive, next_obs)
        return (jnp.where(keep, next_obs, obs), still_alive), out

    alive = jnp.ones(num_starts, jnp.float32)
    _, trajectory = jax.lax.scan(step, (start_obs.astype(jnp.float32), alive), jax.random.split(key, horizon))
    return trajectory


def imagined_advantages(trajectory: Imagined, values, next_values, gamma, lam):
    """GAE advantages and value targets ``[horizon, N]`` of imagined branches.

    ``values[t]`` and ``next_values[t]`` are the critic's values of
    ``trajectory.obs[t]`` and ``trajectory.next_obs[t]``. A predicted
    termination cuts the bootstrap; the last step bootstraps from the value of
    the state the branch reached (the horizon is a truncation, not an end).
    Masked steps (after a termination) get numbers that must be ignored.
    """
    last = jnp.zeros(trajectory.reward.shape).at[-1].set(1.0)
    done = jnp.maximum(trajectory.terminated, last)
    return gae(trajectory.reward, values, next_values, trajectory.terminated, done, gamma, lam)


# --------------------------------------------------------------------------- training state


class Transition(NamedTuple):
    obs: jax.Array  # raw, for the model's buffer
    policy_obs: jax.Array  # as the policy saw it (normalised with the statistics of that moment, if at all)
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array
    env_action: jax.Array


class Buffer(NamedTuple):
    """Ring buffer of real transitions; ``position`` is where the next write starts."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    next_obs: jax.Array
    position: jax.Array
    size: jax.Array


class ModelStats(NamedTuple):
    """Running statistics that normalise the model's inputs and targets."""

    obs: RunningStats
    delta: RunningStats
    reward: RunningStats


class Policy(NamedTuple):
    """What acting needs: network parameters and the observation statistics."""

    params: Any
    obs_stats: RunningStats


class WorldModel(NamedTuple):
    """What imagining needs: the ensemble's parameters and the statistics that normalise its inputs and outputs."""

    params: Any  # [ensemble_size, num_model_params]
    stats: ModelStats


class TrainState(struct.PyTreeNode):
    params: Any
    opt_state: Any
    model_params: Any  # [ensemble_size, num_model_params]
    model_opt_state: Any
    model_stats: ModelStats
    buffer: Buffer
    env_state: Any
    obs: jax.Array
    episode_return: jax.Array  # per env, running undiscounted return
    last_episode_return: jax.Array  # per env, return of the last finished episode
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array

    @property
    def policy(self) -> Policy:
        return Policy(self.params, self.model_stats.obs)

    @property
    def world_model(self) -> WorldModel:
        return WorldModel(self.model_params, self.model_stats)


class Agent(NamedTuple):
    init: Callable  # key -> TrainState
    update: Callable  # TrainState -> (TrainState, metrics)
    act: Callable  # (Policy, obs, key, greedy) -> action
    value: Callable  # (Policy, obs) -> state value
    model_step: Callable  # (model_params, ModelStats, obs, action, key) -> (next_obs, reward, termination_logit)
    imagine: Callable  # (WorldModel, Policy, start_obs [N, ...], horizon, key) -> Imagined [horizon, N, ...]


def action_spec(env, env_params):
    """(action_dim, continuous, low, high) from a gymnax action space."""
    space = env.action_space(env_params)
    if hasattr(space, "n"):
        return int(space.n), False, None, None
    low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape)
    high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape)
    return int(np.prod(space.shape)), True, low, high


def make(config: Config, env, env_params) -> Agent:
    """Build Dyna-PPO's pure functions for one environment with vector observations."""
    action_dim, continuous, low, high = action_spec(env, env_params)
    validate_for_env(config, env, env_params)
    obs_shape = env.observation_space(env_params).shape
    obs_dim = obs_shape[0]
    network = ActorCritic(action_dim, continuous, tuple(config.hidden_sizes), config.activation, config.init_log_std)
    template = jax.eval_shape(network.init, jax.random.PRNGKey(0), jnp.zeros(obs_shape))
    _, unravel = ravel_pytree(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), template))

    def apply(flat_params, obs, method=None):
        return network.apply(unravel(flat_params), obs, method=method)

    # Dynamics model: [normalised obs, action features] -> [normalised obs change, normalised reward, logit].
    model_net = MLP(tuple(config.model_hidden_sizes), config.model_activation, obs_dim + 2, 1.0)
    model_in = jnp.zeros(obs_dim + action_dim)
    model_template = jax.eval_shape(model_net.init, jax.random.PRNGKey(0), model_in)
    _, unravel_model = ravel_pytree(jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), model_template))
    num_members, grad_steps = config.ensemble_size, config.grad_steps
    num_minibatches = config.num_minibatches

    def member_apply(flat, x):
        return model_net.apply(unravel_model(flat), x)

    def learning_rate(count):
        if not config.anneal_lr:
            return config.lr
        return config.lr * jnp.maximum(1.0 - (count // grad_steps) / config.num_updates, 0.0)  # 0 past the end

    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate, eps=config.adam_eps),
    )
    model_optimizer = optax.adam(config.model_lr)

    def prepare_obs(obs_stats, obs):
        if config.normalize_observations:
            return normalize(obs_stats, obs, config.clip_observations)
        return obs

    def to_env_action(action):
        return jnp.clip(action, low, high) if continuous else action

    def action_features(env_action):
        if continuous:
            return env_action.reshape(env_action.shape[:-1] + (action_dim,)).astype(jnp.float32)
        return jax.nn.one_hot(env_action, action_dim)

    def model_inputs(stats: ModelStats, obs, env_action):
        return jnp.concatenate([normalize(stats.obs, obs, config.clip_observations), action_features(env_action)], -1)

    def decode(stats: ModelStats, obs, out):
        """Model outputs -> (next_obs, reward, termination_logit) in environment units."""
        next_obs = obs + stats.delta.mean + stats.delta.std * out[..., :obs_dim]
        reward = stats.reward.mean + stats.reward.std * out[..., obs_dim]
        return next_obs, reward, out[..., obs_dim + 1]

    def model_step(model_params, stats: ModelStats, obs, action, key):
        """One imagined step of a batch ``[N, obs_dim]``: each row goes through a uniformly random member.

        A random permutation deals the rows out evenly (``N`` must be a multiple
        of ``ensemble_size``), so each member runs once on ``N / ensemble_size`` rows.
        """
        n = obs.shape[0]
        permutation = jax.random.permutation(key, n)
        x = model_inputs(stats, obs, to_env_action(action))[permutation].reshape(num_members, n // num_members, -1)
        out = jax.vmap(member_apply)(model_params, x).reshape(n, -1)
        out = jnp.zeros_like(out).at[permutation].set(out)
        return decode(stats, obs, out)

    def act(policy: Policy, obs, key, greedy: bool = False):
        """Action for one observation (or a batch) under the current policy."""
        dist = apply(policy.params, prepare_obs(policy.obs_stats, obs), method=ActorCritic.policy)
        action = dist.mode() if greedy else dist.sample(seed=key)
        return to_env_action(action)

    def value(policy: Policy, obs):
        """The critic's estimate for an observation (or a batch)."""
        return apply(policy.params, prepare_obs(policy.obs_stats, obs), method=ActorCritic.value)

    def imagine(world_model: WorldModel, policy: Policy, start_obs, horizon: int, key) -> Imagined:
        """``horizon`` steps of ``policy`` in the learned ensemble from each of ``start_obs`` ``[N, ...]``.

        Actions are the policy's unclipped samples (what PPO's log-probabilities refer to); the
        model clips them to the action space itself. ``N`` must be a multiple of ``ensemble_size``.
        """
        def policy_fn(obs, key):
            return apply(policy.params, prepare_obs(policy.obs_stats, obs), method=ActorCritic.policy).sample(seed=key)

        def step(params, obs, action, key):
            return model_step(params, world_model.stats, obs, action, key)

        return imagine_with(step, world_model.params, policy_fn, start_obs, horizon, key)

    env_action_shape = () if not continuous else (action_dim,)

    def init(key) -> TrainState:
        net_key, model_key, env_key, key = jax.random.split(key, 4)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(env_key, config.num_envs), env_params)
        params, _ = ravel_pytree(network.init(net_key, jnp.zeros(obs_shape)))
        # lax.map, not vmap: a batched QR (orthogonal init) hangs jaxlib 0.10's CPU runtime under shard_map
        # over several devices, as the rlx runner runs seeds on a multi-core CPU.
        model_params = jax.lax.map(lambda k: ravel_pytree(model_net.init(k, model_in))[0],
                                   jax.random.split(model_key, num_members))
        capacity = config.buffer_size
        buffer = Buffer(
            obs=jnp.zeros((capacity, obs_dim)),
            action=jnp.zeros((capacity,) + env_action_shape, jnp.float32 if continuous else jnp.int32),
            reward=jnp.zeros(capacity),
            terminated=jnp.zeros(capacity),
            next_obs=jnp.zeros((capacity, obs_dim)),
            position=jnp.asarray(0, jnp.int32),
            size=jnp.asarray(0, jnp.int32),
        )
        stats = ModelStats(RunningStats.create(obs_shape).update(obs), RunningStats.create(obs_shape),
                           RunningStats.create(()))
        zeros = jnp.zeros(config.num_envs)
        return TrainState(
            params=params,
            opt_state=optimizer.init(params),
            model_params=model_params,
            model_opt_state=model_optimizer.init(model_params),
            model_stats=stats,
            buffer=buffer,
            env_state=env_state,
            obs=obs,
            episode_return=zeros,
            last_episode_return=zeros,
            key=key,
            update_step=jnp.asarray(0, jnp.int32),
            env_steps=jnp.asarray(0, jnp.int32),
        )

    # ------------------------------------------------------------------ real experience

    def env_step(state: TrainState, _):
        key, action_key, step_key = jax.random.split(state.key, 3)
        obs_in = prepare_obs(state.model_stats.obs, state.obs)
        dist, value = apply(state.params, obs_in)
        action = dist.sample(seed=action_key)
        log_prob = dist.log_prob(action)
        env_action = to_env_action(action)
        step_keys = jax.random.split(step_key, config.num_envs)
        next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            step_keys, state.env_state, env_action, env_params
        )
        reward = reward.astype(jnp.float32)
        terminated = terminated.astype(jnp.float32)
        done = jnp.logical_or(terminated, truncated).astype(jnp.float32)
        episode_return = state.episode_return + reward
        transition = Transition(
            state.obs, obs_in, action, log_prob, value, reward, terminated, done, info["final_observation"], env_action
        )
        state = state.replace(
            env_state=env_state,
            obs=next_obs,
            episode_return=episode_return * (1.0 - done),
            last_episode_return=jnp.where(done > 0, episode_return, state.last_episode_return),
            key=key,
        )
        return state, transition

    def store(buffer: Buffer, traj: Transition) -> Buffer:
        """Write the rollout (time-major, so the newest transitions come last) into the ring buffer."""
        flat = jax.tree.map(lambda x: x.reshape((config.real_steps_per_update,) + x.shape[2:]), traj)
        index = (buffer.position + jnp.arange(config.real_steps_per_update)) % config.buffer_size
        return Buffer(
            obs=buffer.obs.at[index].set(flat.obs),
            action=buffer.action.at[index].set(flat.env_action.astype(buffer.action.dtype)),
            reward=buffer.reward.at[index].set(flat.reward),
            terminated=buffer.terminated.at[index].set(flat.terminated),
            next_obs=buffer.next_obs.at[index].set(flat.final_obs),
            position=(buffer.position + config.real_steps_per_update) % config.buffer_size,
            size=jnp.minimum(buffer.size + config.real_steps_per_update, config.buffer_size),
        )

    def by_age(buffer: Buffer, ages):
        """Buffer indices of the transitions written ``ages`` writes before the newest (age 0)."""
        return (buffer.position - 1 - ages) % config.buffer_size

    # ------------------------------------------------------------------ dynamics model

    def model_targets(stats: ModelStats, obs, next_obs, reward):
        delta = (next_obs - obs - stats.delta.mean) / stats.delta.std
        return delta, (reward - stats.reward.mean) / stats.reward.std

    def member_loss(flat, stats: ModelStats, termination_rate, obs, action, reward, terminated, next_obs):
        out = member_apply(flat, model_inputs(stats, obs, action))
        delta_target, reward_target = model_targets(stats, obs, next_obs, reward)
        obs_loss = ((out[..., :obs_dim] - delta_target) ** 2).mean()
        reward_loss = ((out[..., obs_dim] - reward_target) ** 2).mean()
        termination_loss = optax.sigmoid_binary_cross_entropy(out[..., obs_dim + 1], terminated)
        if config.balance_terminations:
            # terminations and non-terminations weigh half each, by the buffer's termination rate
            rate = jnp.clip(termination_rate, 1e-3, 0.5)
            termination_loss = termination_loss * (terminated * 0.5 / rate + (1.0 - terminated) * 0.5 / (1.0 - rate))
        termination_loss = termination_loss.mean()
        return obs_loss + config.reward_coef * reward_loss + config.termination_coef * termination_loss

    def ensemble_loss(model_params, stats, termination_rate, batch):
        losses = jax.vmap(member_loss, in_axes=(0, None, None, 0, 0, 0, 0, 0))(
            model_params, stats, termination_rate, *batch
        )
        return losses.sum(), losses.mean()

    model_grad = jax.value_and_grad(ensemble_loss, has_aux=True)

    def train_model(model_params, model_opt_state, stats: ModelStats, buffer: Buffer, key):
        """``grad_steps`` Adam steps; each member draws its own minibatch from all but the held-out newest."""
        held_out = config.holdout_size
        termination_rate = buffer.terminated.sum() / jnp.maximum(buffer.size, 1)

        def step(carry, key):
            model_params, model_opt_state = carry
            u = jax.random.uniform(key, (num_members, config.model_batch_size))
            ages = held_out + (u * (buffer.size - held_out)).astype(jnp.int32)
            index = by_age(buffer, ages)
            batch = (buffer.obs[index], buffer.action[index], buffer.reward[index], buffer.terminated[index],
                     buffer.next_obs[index])
            (_, loss), grads = model_grad(model_params, stats, termination_rate, batch)
            updates, model_opt_state = model_optimizer.update(grads, model_opt_state, model_params)
            return (optax.apply_updates(model_params, updates), model_opt_state), loss

        (model_params, model_opt_state), losses = jax.lax.scan(
            step, (model_params, model_opt_state), jax.random.split(key, grad_steps)
        )
        return model_params, model_opt_state, losses.mean()

    def held_out_errors(model_params, stats: ModelStats, buffer: Buffer):
        """One-step errors of the ensemble-mean prediction on the newest ``holdout_size`` transitions."""
        index = by_age(buffer, jnp.arange(max(config.holdout_size, 1)))
        obs, action = buffer.obs[index], buffer.action[index]
        out = jax.vmap(member_apply, in_axes=(0, None))(model_params, model_inputs(stats, obs, action)).mean(0)
        delta_target, _ = model_targets(stats, obs, buffer.next_obs[index], buffer.reward[index])
        _, reward, logit = decode(stats, obs, out)
        predicted_termination = (logit > 0).astype(jnp.float32)
        errors = {
            "model_error_1step": ((out[..., :obs_dim] - delta_target) ** 2).mean(),
            "reward_mse": ((reward - buffer.reward[index]) ** 2).mean(),
            "termination_accuracy": (predicted_termination == buffer.terminated[index]).mean(),
        }
        if config.holdout_size == 0:  # nothing held out: undefined
            errors = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), errors)
        return errors

    # ------------------------------------------------------------------ PPO on real + imagined data

    def minibatch_loss(params, real, imagined, real_fraction):
        def part(batch):
            obs, action, old_log_prob, old_value, advantages, targets, weight = batch
            dist, value = apply(params, obs)
            return ppo_loss_terms(
                config, dist.log_prob(action), old_log_prob, dist.entropy(), value, old_value, advantages, targets,
                weight,
            )

        real_loss, real_terms = part(real)
        imagined_loss, imagined_terms = part(imagined)
        mix = lambda a, b: real_fraction * a + (1.0 - real_fraction) * b  # noqa: E731
        return mix(real_loss, imagined_loss), jax.tree.map(mix, real_terms, imagined_terms)

    grad_fn = jax.value_and_grad(minibatch_loss, has_aux=True)

    def split_minibatches(batch, key):
        size = jax.tree.leaves(batch)[0].shape[0]
        per = size // num_minibatches
        permutation = jax.random.permutation(key, size)[: per * num_minibatches]
        return jax.tree.map(lambda x: x[permutation].reshape((num_minibatches, per) + x.shape[1:]), batch)

    def learn_epoch(carry, key):
        params, opt_state, real, imagined = carry
        real_key, imagined_key = jax.random.split(key)
        minibatches = (split_minibatches(real, real_key), split_minibatches(imagined, imagined_key))

        def learn_minibatch(carry, minibatch):
            params, opt_state = carry
            (loss, terms), grads = grad_fn(params, *minibatch, config.real_fraction)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params, opt_state), {"loss": loss, "grad_norm": optax.tree.norm(grads), **terms}

        (params, opt_state), metrics = jax.lax.scan(learn_minibatch, (params, opt_state), minibatches)
        return (params, opt_state, real, imagined), metrics

    def imagined_batch(state: TrainState, model_params, stats: ModelStats, buffer: Buffer, key):
        start_key, rollout_key = jax.random.split(key)
        window = buffer.size if config.start_window <= 0 else jnp.minimum(buffer.size, config.start_window)
        ages = (jax.random.uniform(start_key, (config.num_branches,)) * window).astype(jnp.int32)
        start_obs = buffer.obs[by_age(buffer, ages)]
        traj = imagine(WorldModel(model_params, stats), Policy(state.params, stats.obs), start_obs, config.horizon,
                       rollout_key)
        obs_in = prepare_obs(stats.obs, traj.obs)
        dist, values = apply(state.params, obs_in)
        log_prob = dist.log_prob(traj.action)
        next_values = apply(state.params, prepare_obs(stats.obs, traj.next_obs), method=ActorCritic.value)
        advantages, targets = imagined_advantages(traj, values, next_values, config.gamma, config.gae_lambda)
        batch = (obs_in, traj.action, log_prob, values, advantages, targets, traj.mask)
        batch = jax.tree.map(lambda x: x.reshape((config.imagined_batch_size,) + x.shape[2:]), batch)
        metrics = {
            "imagined_return": (traj.reward * traj.mask).sum(0).mean(),
            "imagined_length": traj.mask.sum(0).mean(),
        }
        return batch, metrics

    def update(state: TrainState):
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)
        key, model_key, imagine_key, learn_key = jax.random.split(state.key, 4)

        # 1. remember the real transitions; refresh the normalisation statistics
        buffer = store(state.buffer, traj)
        flat_obs = traj.obs.reshape((-1, obs_dim))
        flat_next = traj.final_obs.reshape((-1, obs_dim))
        stats = ModelStats(
            state.model_stats.obs.update(flat_obs),
            state.model_stats.delta.update(flat_next - flat_obs),
            state.model_stats.reward.update(traj.reward.reshape(-1)),
        )

        # 2. fit the dynamics ensemble, then score it on the held-out newest transitions
        model_params, model_opt_state, model_loss = train_model(
            state.model_params, state.model_opt_state, stats, buffer, model_key
        )
        model_metrics = held_out_errors(model_params, stats, buffer)

        # 3. real batch: GAE on true rewards (as ppo.py); imagined batch: branches from buffer states
        real_obs = traj.policy_obs
        # the statistics the rollout acted with, so that a bootstrap and the next step's own value agree
        next_values = apply(state.params, prepare_obs(state.model_stats.obs, traj.final_obs), method=ActorCritic.value)
        advantages, targets = gae(
            traj.reward, traj.value, next_values, traj.terminated, traj.done, config.gamma, config.gae_lambda
        )
        real = (real_obs, traj.action, traj.log_prob, traj.value, advantages, targets, jnp.ones_like(targets))
        real = jax.tree.map(lambda x: x.reshape((config.real_steps_per_update,) + x.shape[2:]), real)
        imagined, imagined_metrics = imagined_batch(state, model_params, stats, buffer, imagine_key)

        # 4. PPO epochs over both
        (params, opt_state, _, _), metrics = jax.lax.scan(
            learn_epoch, (state.params, state.opt_state, real, imagined), jax.random.split(learn_key, config.num_epochs)
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        state = state.replace(
            params=params,
            opt_state=opt_state,
            model_params=model_params,
            model_opt_state=model_opt_state,
            model_stats=stats,
            buffer=buffer,
            key=key,
            update_step=state.update_step + 1,
            env_steps=state.env_steps + config.real_steps_per_update,
        )
        metrics.update(model_metrics)
        metrics.update(imagined_metrics)
        metrics["model_loss"] = model_loss
        metrics["train_return"] = state.last_episode_return.mean()
        metrics["learning_rate"] = learning_rate(state.update_step * grad_steps - 1)
        metrics["train_ratio"] = jnp.asarray(grad_steps / config.real_steps_per_update, jnp.float32)
        return state, metrics

    return Agent(init, update, act, value, model_step, imagine)


def train(config: Config, env, env_params, key, num_updates: int | None = None):
    """Train from scratch: ``init`` then ``num_updates`` (default: all) updates under ``lax.scan``."""
    agent = make(config, env, env_params)

    def run(key):
        state = agent.init(key)
        return jax.lax.scan(lambda s, _: agent.update(s), state, None, num_updates or config.num_updates)

    return jax.jit(run)(key)


def cartpole_config(**overrides) -> Config:
    """The CartPole settings of the command-line demo."""
    return Config(**overrides)


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

    parser = argparse.ArgumentParser(description="Train Dyna-PPO (PPO on imagined rollouts) on gymnax CartPole-v1.")
    parser.add_argument("--timesteps", type=int, default=20_480)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = CartPole()
    config = cartpole_config(total_timesteps=args.timesteps)
    validate(config)
    start = time.perf_counter()
    state, metrics = train(config, env, env.default_params, jax.random.PRNGKey(args.seed))
    returns = np.asarray(metrics["train_return"])
    errors = np.asarray(metrics["model_error_1step"])
    step = max(1, len(returns) // 10)
    for i in range(step - 1, len(returns), step):
        print(f"update {i + 1:5d}  env steps {(i + 1) * config.real_steps_per_update:8d}  "
              f"train return {returns[i]:7.1f}  model error {errors[i]:.4f}")
    print(f"final train return {returns[-1]:.1f} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    _cli()
