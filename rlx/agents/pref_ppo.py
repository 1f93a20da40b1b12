"""Online preference-based PPO (PEBBLE-style reward learning, with a QPA option) in one file.

Vendorable: this file imports only jax, flax, optax and numpy. Copy it into
your project and run ``python pref_ppo.py`` to train CartPole from the
preferences of a scripted oracle teacher.

The agent never trains on the environment's reward. Each ``update``:

1. collects a rollout of ``[num_steps, num_envs]`` steps with the current policy;
   the environment's true reward is kept only for the teacher and for metrics;
2. cuts the rollout along time into segments of ``segment_length`` steps per env
   (observation, action, teacher reward per step) and writes them into the
   *query pool*, a fixed-shape ring buffer of the last ``pool_segments`` segments;
3. on feedback updates (every ``feedback_every`` updates from update
   ``pretrain_updates`` on, while fewer than ``budget`` labels are used) draws
   ``num_candidates`` random segment pairs, keeps the ``queries_per_feedback``
   most informative under ``selection``, asks the scripted ``teacher`` for labels,
   stores them in the label buffer (capacity ``budget``) and trains the reward
   model for ``reward_steps`` Adam steps on random minibatches of that buffer;
4. relabels its rollout with the reward model -- the mean over an ensemble of
   ``ensemble_size`` MLPs ``r_hat(obs, action)`` -- or, during the first
   ``pretrain_updates`` updates, with a state-entropy bonus (PEBBLE's unsupervised
   pre-training), and runs PPO on that reward.

Metrics per update (scalars) add to PPO's: ``train_return`` (true return of the
last finished episode, mean over envs), ``learned_return`` (sum of the
ensemble-mean learned reward PPO trains on -- ``r_hat``, or ``r_hat - r_abs`` with
absorbing terminations -- over those same episodes), ``learned_reward_mean``
(its mean per step of the rollout), ``labels_used``, ``asked_feedback``,
``reward_loss`` (last-epoch Bradley-Terry loss; NaN without a feedback round),
``reward_model_accuracy`` (on ``eval_pairs`` random pairs of this rollout's
segments, oracle-labelled outside the budget, ties left out; NaN when every pair
ties) and ``rank_correlation`` (Spearman, average ranks for ties, between learned
and teacher segment returns of this rollout; 0 when either is constant, e.g. a
CartPole rollout without a fall).

``query_policy_aligned=True`` switches on QPA (Hu et al. 2023): candidates come
only from the segments of the latest ``aligned_rollouts`` rollouts (default 1: the
current policy's), and the reward model trains on random temporal crops of each
labelled pair.

Shape of the API (shared by every rlx agent): ``Config`` (a ``flax.struct``
dataclass; numeric fields are pytree leaves, ``static`` fields shape the
program), ``validate(config)``, ``make(config, env, env_params) -> Agent(init,
update, act, value)`` and ``train(config, env, env_params, key)``. Environments
follow the gymnax 1.0 API (``step`` returns ``obs, state, reward, terminated,
truncated, info`` with auto-reset and ``info["final_observation"]``).

Episodic tasks and learned rewards: a Bradley-Terry reward model is only known up
to an additive constant, and that constant decides whether an agent whose return
stops at termination wants to live or die. ``termination_value`` says how that
constant is pinned down:

* ``absorbing`` (default, as DAC treats terminal states in imitation): after a
  termination the episode sits in an absorbing state for ever. Inside a segment,
  the steps after a termination (the next episode, after the auto-reset) stand for
  that state (``Segments.absorbing``): the teacher scores them
  ``teacher_absorbing_reward`` (0, the true reward of a finished episode), and each
  reward-model member scores them with one learned scalar, its absorbing reward
  ``r_abs``. Comparing a segment that ends early with one that goes on then teaches
  whether ending is good (Acrobot, MountainCar) or bad (CartPole). PPO trains on
  ``r_hat - r_abs`` with terminations ending the return, which is the same as
  living on in the absorbing state at reward 0.
* ``last`` / ``final`` (with ``bootstrap_on_termination``): a termination does not
  end the return, so only reward *differences* matter; ``last`` bootstraps the value
  of the state the episode ended in, as if the agent stayed there collecting its
  learned reward, ``final`` the value of the observation past the end (out of
  bounds, never a training input: an extrapolation that an agent can learn to
  exploit by falling fast). A termination then costs only the learned reward of the
  falling step, so when every step pays the same (CartPole) no teacher can tell
  segments apart; ``teacher_terminal_penalty`` is subtracted from the teacher's
  reward on terminating steps, so a scripted teacher prefers segments without falls
  (the true ``train_return`` metric is unchanged).
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
# Metrics that are NaN when undefined for an update (no feedback round yet; every held-out pair ties);
# a training loop should not treat them as divergence.
METRICS_MAY_BE_NAN = ("reward_loss", "reward_model_accuracy")
# ``update(state, index)`` takes the update number shared by all runs (see ``update``); the rlx runner passes it.
UPDATE_TAKES_INDEX = True
SELECTIONS = ("uniform", "disagreement", "entropy")
TERMINATION_VALUES = ("absorbing", "last", "final")
TEACHERS = ("oracle", "stochastic", "mistake", "skip", "equal", "myopic", "file")
# With feedback_every=0 the label budget is spread over this fraction of training: labels asked
# for only early describe the early policy's mistakes (CartPole: falling at once), not the later
# one's (drifting off the track), and the learned reward then stops teaching.
FEEDBACK_SPAN = 0.8


def static(default):
    """A dataclass field that is part of the program's structure, not a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """Preference-based PPO hyper-parameters.

    PPO's fields are those of ``ppo.Config``. Reward learning:

    * ``reward_lr`` -- Adam step size of the reward model;
      ``reward_hidden_sizes`` / ``ensemble_size`` -- its MLPs (tanh output, so
      ``r_hat`` is in [-1, 1]; of the observation alone when ``reward_from_actions`` is
      off); ``reward_steps`` Adam steps per feedback round, each on
      ``reward_batch_size`` labelled pairs drawn afresh from the label buffer.
    * ``segment_length`` (divides ``num_steps``), ``pool_segments`` (query pool
      capacity, at least one rollout's ``num_envs * num_steps / segment_length``).
    * ``num_candidates`` random pairs per feedback round, of which the top
      ``queries_per_feedback`` under ``selection`` (``uniform``,
      ``disagreement``, ``entropy``) go to the teacher; at most ``budget`` labels
      in all; a round every ``feedback_every`` updates (0, the default: rounds
      spread evenly over the first ``FEEDBACK_SPAN`` = 80% of training).
    * ``query_policy_aligned`` (QPA) and ``crop_min_fraction`` (shortest crop, as a
      fraction of ``segment_length``; mild crops: 8 of 16 steps hurt on Pendulum);
      ``crop_shift``: each segment of a pair is cropped at its own start, as SURF's temporal
      crops (which QPA uses) are; off by default, one start for both, the crops our studies measured;
      ``aligned_rollouts``: QPA's candidates come from the segments of that many
      latest rollouts (1: the current policy's rollout only).
    * ``pretrain_updates`` updates of state-entropy pre-training, with the
      distance to the ``entropy_k``-th nearest neighbour in the rollout as reward.
    * ``teacher`` kind (static) and its numeric settings: ``teacher_beta``
      (stochastic), ``teacher_epsilon`` (mistake), ``teacher_skip_threshold``
      (skip), ``teacher_equal_threshold`` (equal), ``teacher_gamma`` (myopic),
      ``teacher_terminal_penalty`` (subtracted from the teacher's reward on
      terminating steps), ``teacher_absorbing_reward`` (the teacher's reward of a
      step after a termination, with ``termination_value="absorbing"``).
    * ``termination_value`` (static): ``absorbing``, ``last`` or ``final``, see the
      module docstring; ``bootstrap_on_termination`` matters only for the last two.
    * ``eval_pairs`` oracle-labelled pairs of the latest segments for the
      ``reward_model_accuracy`` metric (not counted in the budget).
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
    reward_lr: float = 1e-3
    teacher_beta: float = 1.0
    teacher_epsilon: float = 0.1
    teacher_skip_threshold: float = 0.0
    teacher_equal_threshold: float = 0.0
    teacher_gamma: float = 0.9
    teacher_terminal_penalty: float = 0.0
    teacher_absorbing_reward: float = 0.0

    total_timesteps: int = static(500_000)
    num_envs: int = static(4)
    num_steps: int = static(128)
    num_epochs: int = static(4)
    num_minibatches: int = static(4)
    hidden_sizes: tuple = static((64, 64))
    activation: str = static("tanh")
    anneal_lr: bool = static(True)
    clip_value_loss: bool = static(True)
    normalize_advantages: bool = static(True)
    normalize_observations: bool = static(False)
    normalize_rewards: bool = static(False)
    clip_observations: float = static(10.0)
    bootstrap_on_termination: bool = static(True)
    termination_value: str = static("absorbing")

    ensemble_size: int = static(3)
    reward_hidden_sizes: tuple = static((64, 64))
    reward_from_actions: bool = static(True)
    reward_steps: int = static(50)
    reward_batch_size: int = static(64)
    segment_length: int = static(16)
    pool_segments: int = static(256)
    num_candidates: int = static(100)
    queries_per_feedback: int = static(10)
    budget: int = static(200)
    feedback_every: int = static(0)
    selection: str = static("disagreement")
    query_policy_aligned: bool = static(False)
    crop_min_fraction: float = static(0.875)
    crop_shift: bool = static(False)  # True: each segment of a pair cropped at its own start (SURF's crops)
    aligned_rollouts: int = static(1)
    pretrain_updates: int = static(0)
    entropy_k: int = static(5)
    teacher: str = static("oracle")
    eval_pairs: int = static(128)

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    @property
    def segments_per_update(self) -> int:
        return self.num_envs * (self.num_steps // self.segment_length)

    @property
    def feedback_rounds(self) -> int:
        return -(-self.budget // self.queries_per_feedback)

    @property
    def feedback_interval(self) -> int:
        """Updates between feedback rounds: ``feedback_every``, or with 0 the interval that spreads
        the rounds evenly over the first ``FEEDBACK_SPAN`` of the updates after pre-training."""
        if self.feedback_every > 0:
            return self.feedback_every
        updates = max(0, self.num_updates - self.pretrain_updates)
        return max(1, int(FEEDBACK_SPAN * updates) // max(1, self.feedback_rounds))


def validate(config: Config) -> None:
    """Raise ``ValueError("field=value: rule")`` for the first invalid field.

    Runs in Python on concrete values, before anything is traced.
    """
    seg_ok = config.segment_length >= 1 and config.num_steps >= 1 and config.num_steps % config.segment_length == 0
    per_rollout = config.segments_per_update if seg_ok else 0  # read only once segment_length's rules hold
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
        ("reward_lr", config.reward_lr > 0, "must be > 0"),
        ("reward_hidden_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.reward_hidden_sizes),
         "every width must be an integer >= 1"),
        ("ensemble_size", config.ensemble_size >= 1, "must be >= 1"),
        (
            "ensemble_size",
            config.selection != "disagreement" or config.ensemble_size >= 2,
            "must be >= 2 for selection='disagreement'",
        ),
        ("reward_steps", config.reward_steps >= 1, "must be >= 1"),
        ("reward_batch_size", config.reward_batch_size >= 1, "must be >= 1"),
        ("segment_length", config.segment_length >= 1, "must be >= 1"),
        ("segment_length", seg_ok, f"must divide num_steps={config.num_steps}"),
        (
            "pool_segments",
            not seg_ok or config.pool_segments >= per_rollout,
            "must hold one rollout's segments num_envs*num_steps/segment_length" + (f"={per_rollout}" if seg_ok else ""),
        ),
        ("queries_per_feedback", config.queries_per_feedback >= 1, "must be >= 1"),
        ("num_candidates", config.num_candidates >= config.queries_per_feedback, "must be >= queries_per_feedback"),
        ("budget", config.budget >= config.queries_per_feedback, "budget smaller than one batch (queries_per_feedback)"),
        ("feedback_every", config.feedback_every >= 0, "must be >= 0 (0: spread the budget over training)"),
        ("selection", config.selection in SELECTIONS, f"must be one of {list(SELECTIONS)}"),
        (
            "crop_min_fraction",
            0 < config.crop_min_fraction <= 1,
            "must be in (0, 1] (the shortest crop as a fraction of segment_length)",
        ),
        (
            "aligned_rollouts",
            1 <= config.aligned_rollouts and config.aligned_rollouts * per_rollout <= config.pool_segments,
            f"must be >= 1 and at most pool_segments / segments per rollout = "
            f"{config.pool_segments // max(1, per_rollout)}",
        ),
        ("pretrain_updates", config.pretrain_updates >= 0, "must be >= 0"),
        ("entropy_k", 1 <= config.entropy_k < config.batch_size, "must be in [1, num_envs*num_steps)"),
        ("teacher", config.teacher in TEACHERS, f"must be one of {list(TEACHERS)}"),
        (
            "termination_value",
            config.termination_value in TERMINATION_VALUES,
            f"must be one of {list(TERMINATION_VALUES)}",
        ),
        ("teacher_beta", config.teacher_beta >= 0, "must be >= 0"),
        ("teacher_epsilon", 0 <= config.teacher_epsilon <= 1, "must be in [0, 1]"),
        ("teacher_equal_threshold", config.teacher_equal_threshold >= 0, "must be >= 0"),
        ("teacher_gamma", 0 <= config.teacher_gamma <= 1, "must be in [0, 1]"),
        ("eval_pairs", config.eval_pairs >= 1, "must be >= 1"),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


def validate_for_env(config: Config, env, env_params) -> None:
    """The checks that need the environment: a segment must fit inside one episode."""
    horizon = getattr(env_params, "max_steps_in_episode", None)
    if horizon is not None and config.segment_length > int(horizon):
        raise ValueError(f"segment_length={config.segment_length}: longer than an episode "
                         f"(max_steps_in_episode={int(horizon)})")


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


class MLP(nn.Module):
    """Orthogonally initialised MLP on flattened inputs with a linear head of ``out_dim`` units."""

    hidden_sizes: tuple
    activation: str
    out_dim: int
    out_scale: float
    obs_rank: int = 1

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        x = x.astype(jnp.float32)
        x = x.reshape(x.shape[: x.ndim - self.obs_rank] + (-1,))
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
    obs_rank: int = 1

    def setup(self):
        self.actor = MLP(self.hidden_sizes, self.activation, self.action_dim, 0.01, self.obs_rank)
        self.critic = MLP(self.hidden_sizes, self.activation, 1, 1.0, self.obs_rank)
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


class RewardMLP(nn.Module):
    """One ensemble member: ``r_hat(features) -> [-1, 1]`` (tanh head, as in PEBBLE).

    ``features`` is the flattened observation concatenated with the action
    features (one-hot for discrete actions, the raw action for continuous ones).
    """

    hidden_sizes: tuple

    @nn.compact
    def __call__(self, x):
        for width in self.hidden_sizes:
            x = nn.leaky_relu(nn.Dense(width)(x))
        return jnp.tanh(nn.Dense(1)(x)).squeeze(-1)


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


# PPO's metrics, averaged over an update's minibatches. They are summed as one packed vector in
# the scan's carry: as separate stacked scan outputs they cost about 8% of the steps/s on a CPU.
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


# --------------------------------------------------------------------------- teachers


def teacher(config: Config, rewards0, rewards1, key):
    """Scripted teacher (B-Pref's): ``(label, skipped)`` for one pair of segments.

    ``rewards0`` and ``rewards1`` are the per-step true rewards ``[segment_length]``
    of the two segments; ``label`` is P(second segment preferred) in {0, 0.5, 1}
    and ``skipped`` a bool. ``config.teacher`` (static) picks the kind, its
    numeric settings are ``Config`` leaves:

    * ``oracle``: 1 if sum1 > sum0, 0 if less, 0.5 if equal;
    * ``stochastic``: label ~ Bernoulli(sigmoid(teacher_beta * (sum1 - sum0)));
    * ``mistake``: the oracle label flipped with probability ``teacher_epsilon``
      (a tie stays 0.5);
    * ``skip``: the oracle label, skipped when neither return is above
      ``teacher_skip_threshold``;
    * ``equal``: 0.5 when ``|sum1 - sum0| < teacher_equal_threshold``, else oracle;
    * ``myopic``: the oracle on returns weighted by ``teacher_gamma**(L-1-t)``,
      so later steps matter more.
    """
    rewards0 = jnp.asarray(rewards0, jnp.float32)
    rewards1 = jnp.asarray(rewards1, jnp.float32)
    if config.teacher == "myopic":
        length = rewards0.shape[-1]
        weights = config.teacher_gamma ** jnp.arange(length - 1, -1, -1, dtype=jnp.float32)
        rewards0, rewards1 = rewards0 * weights, rewards1 * weights
    sum0, sum1 = rewards0.sum(-1), rewards1.sum(-1)
    oracle = jnp.where(sum1 > sum0, 1.0, jnp.where(sum1 < sum0, 0.0, 0.5))
    skipped = jnp.zeros(oracle.shape, bool)
    label = oracle
    if config.teacher == "stochastic":
        label = jax.random.bernoulli(key, jax.nn.sigmoid(config.teacher_beta * (sum1 - sum0))).astype(jnp.float32)
    elif config.teacher == "mistake":
        flip = jax.random.bernoulli(key, config.teacher_epsilon, oracle.shape)
        label = jnp.where(flip, 1.0 - oracle, oracle)
    elif config.teacher == "skip":
        skipped = jnp.maximum(sum0, sum1) <= config.teacher_skip_threshold  # B-Pref keeps max > threshold
    elif config.teacher == "equal":
        label = jnp.where(jnp.abs(sum1 - sum0) < config.teacher_equal_threshold, 0.5, oracle)
    elif config.teacher not in ("oracle", "myopic", "file"):
        raise ValueError(f"teacher={config.teacher!r}: must be one of {list(TEACHERS)}")
    return label, skipped


# --------------------------------------------------------------------------- reward learning


def crop_pair(r0, r1, len_key, start_key, min_fraction: float, shift: bool):
    """Per-step rewards ``[B, L]`` of a pair's two segments, zeroed outside a random window: one length per pair,
    from ``min_fraction`` of L to L steps; one start for both segments, or with ``shift`` one each."""
    batch, full = r0.shape
    shortest = max(1, round(min_fraction * full))
    length = jax.random.randint(len_key, (batch,), shortest, full + 1)
    starts = jax.random.randint(start_key, (2 if shift else 1, batch), 0, full - length + 1)
    t = jnp.arange(full)
    windows = ((t >= starts[..., None]) & (t < (starts + length)[..., None])).astype(jnp.float32)
    return r0 * windows[0], r1 * windows[-1]


def bradley_terry_loss(returns0, returns1, labels, mask):
    """Masked Bradley-Terry cross-entropy on summed segment rewards.

    P(second preferred) = sigmoid(returns1 - returns0); ``labels`` in {0, 0.5, 1}
    (0.5: a tie, both halves of the cross-entropy at equal weight); pairs with
    ``mask`` 0 (skipped queries, empty buffer slots) count for nothing. Returns
    the mean over the unmasked pairs (0 when there are none). Leading axes other
    than the pair axis (an ensemble) are averaged as well.
    """
    logits = returns1 - returns0
    nll = -(labels * jax.nn.log_sigmoid(logits) + (1.0 - labels) * jax.nn.log_sigmoid(-logits))
    mask = jnp.broadcast_to(mask, nll.shape).astype(jnp.float32)
    return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def selection_scores(selection: str, probs, key):
    """Informativeness of each candidate pair; ``probs`` is ``[ensemble, candidates]``.

    ``uniform``: random scores; ``disagreement``: the std over ensemble members of
    P(second preferred); ``entropy``: binary entropy of the ensemble-mean P.
    """
    if selection == "uniform":
        return jax.random.uniform(key, probs.shape[-1:])
    if selection == "disagreement":
        return probs.std(0)
    if selection == "entropy":
        p = jnp.clip(probs.mean(0), 1e-6, 1 - 1e-6)
        return -(p * jnp.log(p) + (1 - p) * jnp.log(1 - p))
    raise ValueError(f"selection={selection!r}: must be one of {list(SELECTIONS)}")


def select_queries(selection: str, probs, key, num_queries: int):
    """Indices of the ``num_queries`` highest-scoring candidate pairs (best first)."""
    return jax.lax.top_k(selection_scores(selection, probs, key), num_queries)[1]


def average_ranks(x):
    """Ranks 0..n-1 of a vector, ties sharing their average rank (O(n^2), for small n)."""
    less = (x[None, :] < x[:, None]).sum(1)
    equal = (x[None, :] == x[:, None]).sum(1)
    return less + (equal - 1) / 2.0


def spearman(x, y):
    """Spearman rank correlation of two vectors (0 when either is constant)."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = jnp.sqrt((rx**2).sum() * (ry**2).sum())
    return jnp.where(denom > 0, (rx * ry).sum() / jnp.where(denom > 0, denom, 1.0), 0.0)


def knn_distance(x, k: int):
    """Distance of each row of ``x`` ``[B, D]`` to its ``k``-th nearest other row."""
    sq = (x**2).sum(-1)
    d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0.0)
    return jnp.sqrt(-jax.lax.top_k(-d2, k + 1)[0][:, k])  # column 0 is the row itself


# --------------------------------------------------------------------------- training state


class Transition(NamedTuple):
    obs: jax.Array  # as the networks see it (normalised if configured)
    env_obs: jax.Array  # raw, for the reward model
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    reward: jax.Array  # true environment reward
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array


class Segments(NamedTuple):
    """A batch of segments: ``obs [S, L, *obs]``, ``action [S, L, A]`` (features), ``reward [S, L]``
    (the teacher's), ``absorbing [S, L]`` (1 on the steps after a termination inside the segment)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    absorbing: jax.Array


class Labels(NamedTuple):
    """Fixed-capacity (``budget``) buffer of labelled pairs; entries ``>= count`` are empty."""

    obs0: jax.Array
    action0: jax.Array
    absorbing0: jax.Array
    obs1: jax.Array
    action1: jax.Array
    absorbing1: jax.Array
    label: jax.Array  # P(second preferred): 0, 0.5 or 1
    valid: jax.Array  # 0 for skipped queries: kept, but masked out of the loss
    count: jax.Array


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
    discounted_return: jax.Array  # per env, of the training reward, for reward scaling
    episode_return: jax.Array  # per env, running true return
    last_episode_return: jax.Array  # per env, true return of the last finished episode
    learned_episode_return: jax.Array  # per env, running sum of the learned (training) reward
    last_learned_return: jax.Array  # per env, its sum over the last finished episode
    reward_params: Any  # {"net": MLPs, "absorbing": absorbing-state rewards}, leading axis ensemble_size
    reward_opt_state: Any
    pool: Segments  # ring buffer of pool_segments segments
    pool_pos: jax.Array
    pool_count: jax.Array
    labels: Labels
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
    reward: Callable  # (reward_params, obs, action) -> ensemble-mean learned reward PPO trains on


def action_spec(env, env_params):
    """(action_dim, continuous, low, high) from a gymnax action space."""
    space = env.action_space(env_params)
    if hasattr(space, "n"):
        return int(space.n), False, None, None
    low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape)
    high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape)
    return int(np.prod(space.shape)), True, low, high


class GivenLabels(NamedTuple):
    """Labelled pairs from outside (a human's label file), for ``teacher="file"``.

    ``obs0/obs1 [P, L, *obs_shape]``, ``action0/action1`` the environment's actions ``[P, L]``
    (discrete) or ``[P, L, A]``, ``label [P]`` = P(second preferred) in {0, 0.5, 1}, ``mask [P]``
    0 for skipped pairs, ``absorbing0/absorbing1 [P, L]`` (optional) 1 on the steps after the
    episode terminated. ``L`` need not be ``segment_length``.
    """

    obs0: Any
    action0: Any
    obs1: Any
    action1: Any
    label: Any
    mask: Any
    absorbing0: Any = None  # [P, L], 1 after a termination inside the segment; None: never
    absorbing1: Any = None


def make(config: Config, env, env_params, given_labels: GivenLabels | None = None) -> Agent:
    """Build preference-based PPO's pure functions for one environment.

    With ``config.teacher == "file"``, ``given_labels`` (exactly ``budget`` pairs) fill the label
    buffer from the start and feedback rounds only retrain the reward model on them.
    """
    if (config.teacher == "file") != (given_labels is not None):
        raise ValueError("teacher='file' needs given_labels, and given_labels need teacher='file'")
    if given_labels is not None and len(given_labels.label) != config.budget:
        raise ValueError(f"budget={config.budget}: must equal the number of given labels ({len(given_labels.label)})")
    action_dim, continuous, low, high = action_spec(env, env_params)
    obs_shape = tuple(env.observation_space(env_params).shape)
    obs_rank = len(obs_shape)
    obs_size = int(np.prod(obs_shape))
    network = ActorCritic(
        action_dim, continuous, tuple(config.hidden_sizes), config.activation, config.init_log_std, obs_rank
    )
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

    L = config.segment_length
    E = config.ensemble_size
    absorbing_terminations = config.termination_value == "absorbing"
    S_new = config.segments_per_update
    reward_net = RewardMLP(tuple(config.reward_hidden_sizes))
    reward_optimizer = optax.adam(config.reward_lr)
    reward_batch = min(config.reward_batch_size, config.budget)

    # ---------------------------------------------------------------- reward model
    def action_features(action):
        if continuous:
            return action.astype(jnp.float32).reshape(action.shape[:-1] + (action_dim,))
        return jax.nn.one_hot(action, action_dim)

    def member_reward(member_params, obs, act_feat):
        """r_hat of one member; ``obs [..., *obs_shape]``, ``act_feat [..., A]`` (zeroed for a state-only reward)."""
        batch_shape = act_feat.shape[:-1]
        if not config.reward_from_actions:
            act_feat = jnp.zeros_like(act_feat)
        x = jnp.concatenate([obs.astype(jnp.float32).reshape(batch_shape + (obs_size,)), act_feat], -1)
        return reward_net.apply(member_params["net"], x)

    def ensemble_reward(reward_params, obs, act_feat):
        """``[E, ...]``: every member's r_hat."""
        return jax.vmap(member_reward, in_axes=(0, None, None))(reward_params, obs, act_feat)

    def absorbing_reward(reward_params, like):
        """Each member's absorbing-state reward, shaped to broadcast against ``like [E, ...]``."""
        r_abs = reward_params["absorbing"]
        return r_abs.reshape(r_abs.shape + (1,) * (like.ndim - r_abs.ndim))

    def in_segment(r_hat, r_abs, absorbing):
        """Per-step rewards inside segments: r_hat, or the absorbing-state reward after a termination."""
        return jnp.where(absorbing > 0, r_abs, r_hat)

    def for_ppo(r_hat, r_abs):
        """The reward PPO trains on: r_hat, less the absorbing state's reward when terminations end the return."""
        return r_hat - r_abs if absorbing_terminations else r_hat

    def ensemble_segment_returns(reward_params, segments: Segments):
        """``[E, S]``: every member's summed reward of each segment."""
        r_hat = ensemble_reward(reward_params, segments.obs, segments.action)
        return in_segment(r_hat, absorbing_reward(reward_params, r_hat), segments.absorbing).sum(-1)

    def reward(reward_params, obs, action):
        """Ensemble-mean learned reward (the one PPO trains on) for raw observations and environment actions."""
        r_hat = ensemble_reward(reward_params, obs, action_features(action))
        return for_ppo(r_hat, absorbing_reward(reward_params, r_hat)).mean(0)

    def pair_probs(reward_params, seg0: Segments, seg1: Segments):
        """``[E, P]``: each member's P(second preferred) for pairs of segments."""
        returns0 = ensemble_segment_returns(reward_params, seg0)
        return jax.nn.sigmoid(ensemble_segment_returns(reward_params, seg1) - returns0)

    def member_loss(member_params, obs0, act0, abs0, obs1, act1, abs1, label, mask, key):
        r_abs = member_params["absorbing"]
        r0 = in_segment(member_reward(member_params, obs0, act0), r_abs, abs0)  # [B, L]
        r1 = in_segment(member_reward(member_params, obs1, act1), r_abs, abs1)
        if config.query_policy_aligned:  # QPA: one random crop length per pair, on both segments
            len_key, start_key = jax.random.split(key)
            r0, r1 = crop_pair(r0, r1, len_key, start_key, config.crop_min_fraction, config.crop_shift)
        return bradley_terry_loss(r0.sum(-1), r1.sum(-1), label, mask)

    member_grad = jax.value_and_grad(member_loss)

    def train_member(member_params, member_opt_state, labels: Labels, key):
        """``reward_steps`` Adam steps, each on a fresh random minibatch of the labels stored so far.

        A fixed number of steps per feedback round (not epochs over the buffer), so the cost of a
        round does not grow with the budget; early rounds, with few labels, revisit them more often.
        """
        filled_last = (jnp.arange(config.budget) >= labels.count) * 2.0

        def step(carry, key):
            params, opt_state = carry
            pick_key, crop_key = jax.random.split(key)
            # distinct stored labels in random order (filled slots sort first); slots past the count are masked
            idx = jnp.argsort(jax.random.uniform(pick_key, (config.budget,)) + filled_last)[:reward_batch]
            mask = (jnp.arange(reward_batch) < labels.count) * labels.valid[idx]
            loss, grads = member_grad(
                params, labels.obs0[idx], labels.action0[idx], labels.absorbing0[idx],
                labels.obs1[idx], labels.action1[idx], labels.absorbing1[idx], labels.label[idx], mask, crop_key,
            )
            updates, new_opt_state = reward_optimizer.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            any_pair = mask.sum() > 0  # a minibatch of skipped queries leaves Adam's state alone
            params, opt_state = jax.tree.map(
                lambda new, old: jnp.where(any_pair, new, old), (new_params, new_opt_state), (params, opt_state)
            )
            return (params, opt_state), loss

        (member_params, member_opt_state), losses = jax.lax.scan(
            step, (member_params, member_opt_state), jax.random.split(key, config.reward_steps)
        )
        return member_params, member_opt_state, losses[-1]

    def train_reward_model(reward_params, reward_opt_state, labels: Labels, key):
        return jax.vmap(train_member, in_axes=(0, 0, None, 0))(
            reward_params, reward_opt_state, labels, jax.random.split(key, E)
        )

    # ---------------------------------------------------------------- queries
    def gather(segments: Segments, index):
        return jax.tree.map(lambda x: x[index], segments)

    def random_pairs(key, count, num):
        """``num`` pairs of distinct indices in [0, count) (equal only when count is 1)."""
        first_key, offset_key = jax.random.split(key)
        i0 = jax.random.randint(first_key, (num,), 0, count)
        offset = jax.random.randint(offset_key, (num,), 1, jnp.maximum(count, 2))
        return i0, (i0 + offset) % count

    def ask_feedback(state: TrainState, new_segments: Segments, key):
        """One feedback round: choose queries, label them, store them and retrain the reward model."""
        pair_key, score_key, teacher_key, train_key = jax.random.split(key, 4)
        if config.teacher == "file":  # every label is in the buffer already: retrain only
            reward_params, reward_opt_state, loss = train_reward_model(
                state.reward_params, state.reward_opt_state, state.labels, train_key
            )
            return state.labels, reward_params, reward_opt_state, loss.mean()
        if config.query_policy_aligned and config.aligned_rollouts == 1:  # this rollout's segments
            source = new_segments
            i0, i1 = random_pairs(pair_key, S_new, config.num_candidates)
        elif config.query_policy_aligned:  # the newest rollouts' segments, counted back from the write position
            source = state.pool
            newest = jnp.minimum(state.pool_count, config.aligned_rollouts * S_new)
            i0, i1 = ((state.pool_pos - 1 - i) % config.pool_segments
                      for i in random_pairs(pair_key, newest, config.num_candidates))
        else:
            source = state.pool
            i0, i1 = random_pairs(pair_key, state.pool_count, config.num_candidates)
        seg0, seg1 = gather(source, i0), gather(source, i1)
        chosen = select_queries(config.selection, pair_probs(state.reward_params, seg0, seg1), score_key,
                                config.queries_per_feedback)
        q0, q1 = gather(seg0, chosen), gather(seg1, chosen)
        label, skipped = jax.vmap(lambda r0, r1, k: teacher(config, r0, r1, k))(
            q0.reward, q1.reward, jax.random.split(teacher_key, config.queries_per_feedback)
        )
        labels = state.labels
        slots = labels.count + jnp.arange(config.queries_per_feedback)
        slots = jnp.where(slots < config.budget, slots, config.budget)  # out of range: dropped
        put = lambda buf, val: buf.at[slots].set(val.astype(buf.dtype), mode="drop")  # noqa: E731
        labels = Labels(
            obs0=put(labels.obs0, q0.obs), action0=put(labels.action0, q0.action),
            absorbing0=put(labels.absorbing0, q0.absorbing),
            obs1=put(labels.obs1, q1.obs), action1=put(labels.action1, q1.action),
            absorbing1=put(labels.absorbing1, q1.absorbing),
            label=put(labels.label, label), valid=put(labels.valid, 1.0 - skipped),
            count=jnp.minimum(labels.count + config.queries_per_feedback, config.budget),
        )
        reward_params, reward_opt_state, loss = train_reward_model(
            state.reward_params, state.reward_opt_state, labels, train_key
        )
        return labels, reward_params, reward_opt_state, loss.mean()

    # ---------------------------------------------------------------- acting
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
        net_key, env_key, reward_key, key = jax.random.split(key, 4)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(env_key, config.num_envs), env_params)
        params, _ = ravel_pytree(network.init(net_key, jnp.zeros(obs_shape)))
        reward_params = {
            "net": jax.vmap(reward_net.init, in_axes=(0, None))(
                jax.random.split(reward_key, E), jnp.zeros(obs_size + action_dim)
            ),
            "absorbing": jnp.zeros(E),  # each member's reward of the state after a termination
        }
        zeros = jnp.zeros(config.num_envs)

        def empty_segments(n):
            return Segments(jnp.zeros((n, L) + obs_shape), jnp.zeros((n, L, action_dim)), jnp.zeros((n, L)),
                            jnp.zeros((n, L)))

        pool = empty_segments(config.pool_segments)
        if given_labels is None:
            stored = empty_segments(config.budget)
            labels = Labels(stored.obs, stored.action, stored.absorbing, stored.obs, stored.action,
                            stored.absorbing, jnp.zeros(config.budget),
                            jnp.zeros(config.budget), jnp.asarray(0, jnp.int32))
        else:
            g = given_labels

            def absorbing_of(mask, action):  # absent, or terminations bootstrapped: no absorbing steps
                shape = np.shape(action)[:2]
                if mask is None or not absorbing_terminations:
                    return jnp.zeros(shape)
                return jnp.asarray(mask, jnp.float32).reshape(shape)

            labels = Labels(
                jnp.asarray(g.obs0, jnp.float32), action_features(jnp.asarray(g.action0)),
                absorbing_of(g.absorbing0, g.action0),
                jnp.asarray(g.obs1, jnp.float32), action_features(jnp.asarray(g.action1)),
                absorbing_of(g.absorbing1, g.action1),
                jnp.asarray(g.label, jnp.float32), jnp.asarray(g.mask, jnp.float32),
                jnp.asarray(config.budget, jnp.int32),
            )
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
            learned_episode_return=zeros,
            last_learned_return=zeros,
            reward_params=reward_params,
            reward_opt_state=jax.vmap(reward_optimizer.init)(reward_params),
            pool=pool,
            pool_pos=jnp.asarray(0, jnp.int32),
            pool_count=jnp.asarray(0, jnp.int32),
            labels=labels,
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
        episode_return = state.episode_return + reward
        transition = Transition(
            obs_in, state.obs, action, log_prob, value, reward, terminated, done, prepare_obs(obs_stats, final_obs)
        )
        state = state.replace(
            env_state=env_state,
            obs=next_obs,
            obs_stats=obs_stats,
            episode_return=episode_return * (1.0 - done),
            last_episode_return=jnp.where(done > 0, episode_return, state.last_episode_return),
            key=key,
        )
        return state, transition

    def cut_time(x):
        """``[T, N, ...]`` -> ``[N * T / L, L, ...]``: segments of ``L`` steps, env-major."""
        x = x.reshape((config.num_steps // L, L, config.num_envs) + x.shape[2:])
        x = jnp.moveaxis(x, 2, 0)
        return x.reshape((S_new, L) + x.shape[3:])

    def cut_segments(traj: Transition) -> Segments:
        """A ``[T, N]`` rollout as ``[N * T / L]`` segments, with the teacher's reward per step.

        With absorbing terminations, the steps of a segment after its first termination (the next
        episode, after the auto-reset) stand for the absorbing state: the teacher sees
        ``teacher_absorbing_reward`` there and the reward model its learned absorbing reward.
        """
        teacher_reward = cut_time(traj.reward - config.teacher_terminal_penalty * traj.terminated)
        terminated = cut_time(traj.terminated)
        absorbing = jnp.zeros_like(terminated)
        if absorbing_terminations:
            absorbing = ((jnp.cumsum(terminated, axis=1) - terminated) > 0).astype(jnp.float32)
            teacher_reward = jnp.where(absorbing > 0, config.teacher_absorbing_reward, teacher_reward)
        return Segments(cut_time(traj.env_obs), cut_time(action_features(traj.action)), teacher_reward, absorbing)

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

    def feedback_due(update_index):
        """Whether update number ``update_index`` (from 0) runs a feedback round."""
        since = update_index - config.pretrain_updates
        every = config.feedback_interval
        return (since >= 0) & (since % every == 0) & (since // every < config.feedback_rounds)

    def update(state: TrainState, index=None):
        """One iteration: rollout, query pool, maybe a feedback round, PPO on the learned reward.

        ``index`` is the update number when the caller knows it for every run at once (``train`` and
        the rlx runner pass their scan counter). Under ``vmap`` over seeds, the feedback round is
        then a real branch, skipped on the updates without one; from ``state.update_step`` (a
        per-seed value) it would become a select that trains the reward model on every update.
        """
        state, traj = jax.lax.scan(env_step, state, None, config.num_steps)
        key, feedback_key, eval_key, learn_key = jax.random.split(state.key, 4)

        # 1. the query pool: this rollout's segments overwrite the oldest ones
        new_segments = cut_segments(traj)
        slots = (state.pool_pos + jnp.arange(S_new)) % config.pool_segments
        pool = jax.tree.map(lambda buf, val: buf.at[slots].set(val), state.pool, new_segments)
        state = state.replace(
            pool=pool,
            pool_pos=(state.pool_pos + S_new) % config.pool_segments,
            pool_count=jnp.minimum(state.pool_count + S_new, config.pool_segments),
        )

        # 2. feedback round (a lax.cond on the update counter and the labels left)
        ask = feedback_due(state.update_step if index is None else index)
        labels, reward_params, reward_opt_state, reward_loss = jax.lax.cond(
            ask,
            lambda: ask_feedback(state, new_segments, feedback_key),
            lambda: (state.labels, state.reward_params, state.reward_opt_state, jnp.asarray(jnp.nan, jnp.float32)),
        )
        state = state.replace(labels=labels, reward_params=reward_params, reward_opt_state=reward_opt_state)

        # 3. relabel the rollout with the learned reward (or the state-entropy bonus while pre-training)
        member_r_hat = ensemble_reward(reward_params, traj.env_obs, action_features(traj.action))  # [E, T, N]
        r_abs = absorbing_reward(reward_params, member_r_hat)
        learned_reward = for_ppo(member_r_hat, r_abs).mean(0)
        train_reward = learned_reward  # [T, N]
        if config.pretrain_updates > 0:
            flat_obs = traj.env_obs.reshape((config.batch_size, obs_size)).astype(jnp.float32)
            bonus = knn_distance(flat_obs, config.entropy_k).reshape(learned_reward.shape)
            train_reward = jnp.where(state.update_step < config.pretrain_updates, bonus, learned_reward)

        reward_stats, discounted_return = state.reward_stats, state.discounted_return
        if config.normalize_rewards:
            def scale(carry, step):
                stats, ret = carry
                r, done = step
                ret = ret * config.gamma + r
                stats = stats.update(ret)
                return (stats, ret * (1.0 - done)), r / jnp.sqrt(stats.var + 1e-8)

            (reward_stats, discounted_return), train_reward = jax.lax.scan(
                scale, (reward_stats, discounted_return), (train_reward, traj.done)
            )

        def learned_returns(carry, step):
            running, last = carry
            r, done = step
            running = running + r
            return (running * (1.0 - done), jnp.where(done > 0, running, last)), None

        (learned_episode_return, last_learned_return), _ = jax.lax.scan(
            learned_returns, (state.learned_episode_return, state.last_learned_return), (learned_reward, traj.done)
        )

        # 4. PPO on the learned reward
        next_values = apply(state.params, traj.final_obs, method=ActorCritic.value)
        bootstrap = config.bootstrap_on_termination and not absorbing_terminations
        if bootstrap and config.termination_value == "last":
            next_values = jnp.where(traj.terminated > 0, traj.value, next_values)
        terminated = jnp.zeros_like(traj.terminated) if bootstrap else traj.terminated
        advantages, targets = gae(
            train_reward, traj.value, next_values, terminated, traj.done, config.gamma, config.gae_lambda
        )
        batch = (traj.obs, traj.action, traj.log_prob, traj.value, advantages, targets)
        batch = jax.tree.map(lambda x: x.reshape((config.batch_size,) + x.shape[2:]), batch)
        totals = jnp.zeros(len(LEARN_METRICS))
        (params, opt_state, totals, _, _), _ = jax.lax.scan(
            learn_epoch, (state.params, state.opt_state, totals, batch, learn_key), None, config.num_epochs
        )
        metrics = dict(zip(LEARN_METRICS, totals / updates_per_iteration))

        # 5. reward-model metrics on the latest segments (oracle labels, outside the budget)
        # (the segments are this rollout cut up: the r_hat above serves, no second pass of the reward model)
        member_seg_returns = in_segment(jax.vmap(cut_time)(member_r_hat), r_abs, new_segments.absorbing).sum(-1)
        true_seg_returns = new_segments.reward.sum(-1)
        e0, e1 = random_pairs(eval_key, S_new, config.eval_pairs)
        true0, true1 = true_seg_returns[e0], true_seg_returns[e1]
        p = jax.nn.sigmoid(member_seg_returns[:, e1] - member_seg_returns[:, e0]).mean(0)
        decided = (true0 != true1).astype(jnp.float32)
        correct = ((p > 0.5) == (true1 > true0)).astype(jnp.float32)
        accuracy = jnp.where(decided.sum() > 0, (correct * decided).sum() / jnp.maximum(decided.sum(), 1.0), jnp.nan)
        learned_seg_returns = member_seg_returns.mean(0)

        state = state.replace(
            params=params,
            opt_state=opt_state,
            reward_stats=reward_stats,
            discounted_return=discounted_return,
            learned_episode_return=learned_episode_return,
            last_learned_return=last_learned_return,
            key=key,
            update_step=state.update_step + 1,
            env_steps=state.env_steps + config.batch_size,
        )
        metrics["train_return"] = state.last_episode_return.mean()
        metrics["learned_return"] = state.last_learned_return.mean()
        metrics["learned_reward_mean"] = learned_reward.mean()
        metrics["labels_used"] = labels.count.astype(jnp.float32)
        metrics["asked_feedback"] = ask.astype(jnp.float32)
        metrics["reward_loss"] = reward_loss
        metrics["reward_model_accuracy"] = accuracy
        metrics["rank_correlation"] = spearman(learned_seg_returns, true_seg_returns)
        metrics["learning_rate"] = learning_rate(state.update_step * updates_per_iteration - 1)
        return state, metrics

    return Agent(init, update, act, value, reward)


def train(config: Config, env, env_params, key, num_updates: int | None = None):
    """Train from scratch: ``init`` then ``num_updates`` (default: all) updates under ``lax.scan``."""
    agent = make(config, env, env_params)

    def run(key):
        state = agent.init(key)
        return jax.lax.scan(agent.update, state, jnp.arange(num_updates or config.num_updates))

    return jax.jit(run)(key)


def cartpole_config(**overrides) -> Config:
    """The CartPole-from-oracle-preferences settings of the command-line demo."""
    settings = dict(
        total_timesteps=122880, num_envs=8, num_steps=64, lr=2.5e-3, ent_coef=0.0, gamma=0.98, gae_lambda=0.9,
        segment_length=16, pool_segments=256, num_candidates=64, queries_per_feedback=10, budget=100,
        feedback_every=0, reward_steps=25, reward_batch_size=16, teacher="oracle", termination_value="absorbing",
        eval_pairs=64, normalize_rewards=False,
    )
    settings.update(overrides)
    return Config(**settings)


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

    parser = argparse.ArgumentParser(description="Train preference-based PPO on gymnax CartPole-v1 (oracle teacher).")
    parser.add_argument("--timesteps", type=int, default=cartpole_config().total_timesteps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--selection", default="disagreement", choices=SELECTIONS)
    parser.add_argument("--teacher", default="oracle", choices=[t for t in TEACHERS if t != "file"])
    parser.add_argument("--qpa", action="store_true", help="query-policy-aligned queries and crop augmentation")
    args = parser.parse_args()
    env = CartPole()
    config = cartpole_config(
        total_timesteps=args.timesteps, budget=args.budget, selection=args.selection, teacher=args.teacher,
        query_policy_aligned=args.qpa,
    )
    validate(config)
    start = time.perf_counter()
    state, metrics = train(config, env, env.default_params, jax.random.PRNGKey(args.seed))
    metrics = jax.tree.map(np.asarray, metrics)
    returns = metrics["train_return"]
    step = max(1, len(returns) // 10)
    for i in range(step - 1, len(returns), step):
        print(
            f"update {i + 1:5d}  env steps {(i + 1) * config.batch_size:8d}  labels {int(metrics['labels_used'][i]):4d}"
            f"  train return {returns[i]:7.1f}  rank corr {metrics['rank_correlation'][i]:5.2f}"
        )
    print(f"labels used {int(metrics['labels_used'][-1])}")
    print(f"final train return {returns[-1]:.1f} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    _cli()
