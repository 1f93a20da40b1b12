"""DreamerV3-style agent: a latent world model (RSSM) and an actor-critic trained in imagination, in one file.

Vendorable: this file imports only jax, flax, optax and numpy. Copy it into
your project and run ``python dreamer.py`` to train CartPole-v1 (gymnax).
Discrete actions only (``validate_for_env`` rejects a continuous action
space); observations are vectors or ``(H, W, C)`` grids. ``world_model="mlp"``
(default) flattens a grid into the same MLP encoder; ``world_model="conv"``
keeps its cells (see "Spatial world model" below), which a grid world whose
objects move from cell to cell needs to be predicted exactly.

Real data
---------
Each ``update`` runs ``num_steps`` collection steps in each of ``num_envs``
environments with the current policy (``real_steps_per_update = num_envs *
num_steps`` slots), acting from the posterior latent state, which is carried
across updates in the training state (and zeroed at every episode start).
Every slot stores one *observation* in the sequence replay buffer
(``capacity_steps`` time steps x ``num_envs``, ring-indexed), in the "arrival"
convention of Dreamer:

* ``obs[t]`` -- the observation;
* ``action[t]`` -- the action that led to it (0 where ``is_first``);
* ``reward[t]`` -- the reward received on arriving at it (0 where ``is_first``);
* ``terminated[t]`` -- 1 if ``obs[t]`` is terminal (its continuation target
  is ``1 - terminated``); a truncated episode's last observation has 0;
* ``is_first[t]`` -- 1 on the first observation of an episode.

gymnax auto-resets, so when an episode ends the true last observation
(``info["final_observation"]``) is stored, and the *next* slot of that
environment stores the reset observation with ``is_first=1`` without stepping
the environment (the action chosen at a last observation is never applied).
So ``env_steps`` counts slots; about one slot per episode is a reset, not a step.

World model
-----------
Encoder: MLP on the flattened, symlog-squashed observation. RSSM: a
layer-normalised GRU (``deter_size``) driven by ``[z, one-hot action]``, and a
stochastic state ``z`` of ``num_latents`` categoricals with ``num_classes``
classes each (1% uniform mix, straight-through gradients); prior ``p(z|h)``,
posterior ``q(z|h, embed)``. Heads on ``[h, z]``: the decoder (squared error
against the symlog of the flat observation, summed over features), the reward
(squared error in symlog space: the head predicts ``symlog(r)``), and the
continuation (Bernoulli logit of ``1 - terminated``). The loss adds KL
balancing: ``dyn_coef * max(free_nats, KL(sg(post) || prior)) + rep_coef *
max(free_nats, KL(post || sg(prior)))`` per step. It trains on ``batch_size``
sequences of ``seq_len`` steps sampled uniformly from the filled part of the
buffer (the latent starts at zero and is reset wherever ``is_first``).

Spatial world model (``world_model="conv"``, grids only)
-------------------------------------------------------
``ConvWorldModel`` has the same interface on flat vectors, but every cell
has its own state: ``deter_size`` GRU channels and ``num_latents``
categoricals per cell (so ``h`` is ``H*W*deter_size`` long). A step reads
each cell's 3x3 neighbourhood of ``[h, z, one-hot action]`` with one layer
(``conv_hidden`` wide) shared by all cells, then a per-cell GRU; prior,
posterior (on a 3x3 encoder of the observation) and decoder are per cell;
the reward and continuation heads read the max and mean over cells of
per-cell features (an event such as "the agent stands on the goal" happens
in one cell). A move is thus the same local shift everywhere, learnt once
for all positions and levels. On the 9x9 maze the flat model had not beaten
copying the last frame after 2,500 steps; this one predicts it 16x better
after 2,000 (experiments/imagination). One object in many cells weighs
little in the summed squared error: raise ``recon_coef`` (10 on the maze),
or the posterior stops encoding it. ``imagine_starts`` imagines from a
random subset of the batch's posterior states (0: all), since imagination
costs most of a step here.

Actor-critic
------------
``actor_source="imagination"`` (default): every posterior state of the
sampled batch starts an imagined rollout of ``horizon`` steps under the actor
(``imagine``). ``lambda_returns`` use the predicted reward, the continuation
probability times ``gamma`` as the discount, and a slow (EMA, ``critic_ema``)
copy of the critic for the bootstrap and the baseline; a step's weight is the
product of the continuations before it (the first is the real start's
``1 - terminated``). Returns are normalised as in DreamerV3: ``scale = max(1,
EMA of (95th - 5th percentile) of the returns)``. Actor loss: REINFORCE,
``-logpi(a|s) * sg((R - v) / scale) - ent_coef * entropy``; critic: squared
error in symlog space (the critic predicts ``symlog(v)``) against the
lambda-returns. ``actor_source="replay"``: the same losses on the posterior
states of the sampled *real* sequences, with the real rewards,
continuations and actions (lambda-returns along each sequence, cut at episode
boundaries, bootstrapping at truncations and the sequence end): offline
actor-critic on the collected experience, no imagination (off-policy, no
importance correction).

``train_ratio`` is the one knob for how much learning a real step buys: the
number of gradient steps per real environment step, for the world model and
for the actor-critic each (as in ``dyna_ppo.py``). An update makes
``grad_steps = train_ratio * real_steps_per_update`` steps, each one world
model step and one actor-critic step on the same sampled batch; it must be a
positive integer. Training starts once ``seq_len`` steps per environment are
stored (before that the parameters are left unchanged).

Dream augmentations
-------------------
Applied to imagined latent states only, never to world-model training; each
is a numeric config leaf, 0.0 by default (classic imagination), combinable,
and exactly the identity at 0. The paper whose spirit we follow (training
the policy on augmented "dreams" to generalise beyond the experienced states)
did not specify its exact augmentations, so these definitions are ours. ``std``
below is the per-feature standard deviation of the start states' ``h`` over
the batch (no gradient).

* ``dream_noise``: ``augment_step`` adds ``N(0, (dream_noise * std)^2)`` to
  ``h`` at every imagined step (before the prior reads it).
* ``dream_interpolation``: ``augment_start`` mixes each start with a random
  start of a *different* sequence of the batch: ``h' = (1 - a) h + a h_other``,
  the posterior class probabilities mixed the same way and ``z`` resampled by
  them, ``a ~ Uniform(0, dream_interpolation)`` per start
  (``interpolate_states`` does the mixing for a given ``a``).
* ``dream_perturbation``: every imagined trajectory gets a fixed random
  direction ``d`` (a unit vector times ``sqrt(deter_size)``, so one per feature
  in root-mean-square) and ``augment_step`` adds ``dream_perturbation * std *
  d`` to ``h`` at every step: a steady push that drifts the trajectory toward
  states the data never showed, in units of the data's spread like
  ``dream_noise``.

Metrics per update (scalars, means over the update's gradient steps):
``model_loss``, ``recon_loss``, ``reward_loss``, ``cont_loss``, ``kl`` (of
posterior from prior, nats per step), ``actor_loss``, ``critic_loss``,
``entropy``, ``return_scale``, ``imagined_return`` (mean lambda-return of the
start states, reward units), ``model_error_1step`` (squared error per
observation feature of the one-step prior prediction -- previous posterior,
real action, prior mode -- decoded, against the real observation),
``reward_error`` (same prediction's reward, squared error), ``train_return``
(true undiscounted return of the last finished real episode, mean over envs,
as in ``ppo.py``) and ``train_ratio``. ``multistep_error`` (on the Agent)
gives open-loop error against horizon.

Offline study: ``collect`` gathers a ``Dataset`` (NamedTuple of ``[T,
num_envs, ...]`` arrays ``obs, action, reward, terminated, is_first`` in the
convention above) with a uniform random policy (or a given one);
``train_from_dataset`` fills the buffer with it and trains for a given number
of gradient steps without new real data, so imagination, dream-augmented
imagination and replay actor sources can be compared on the same data.

API: ``Config``, ``validate``, ``validate_for_env``, ``make(config, env,
env_params) -> Agent(init, update, act, init_carry, imagine, observe,
multistep_error, train_step, fill, collect, start_states)``, ``train``,
``collect``, ``train_from_dataset``, and the pure pieces ``imagine_with``,
``lambda_returns``, ``kl_loss``, ``augment_start``, ``interpolate_states``,
``augment_step``, ``perturbation_push``, ``symlog``, ``symexp``. ``act`` is
recurrent (``act(policy, carry, obs, reset, key, greedy) -> (carry,
action)``, ``init_carry(batch_size)``), like ``ppo_rnn.py``; ``state.policy``
is what it needs. Sizes default small (deter 64, MLPs 64 wide) so that
CartPole trains in about a minute on two CPU cores; DreamerV3's own sizes are
far larger.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

# Until the buffer holds ``seq_len`` steps per env the learner's update is discarded, and its figures are
# reported as NaN (undefined) with ``learner_ready`` 0; a training loop should not treat that as divergence.
LEARNER_METRICS = ("model_loss", "recon_loss", "reward_loss", "cont_loss", "kl", "model_error_1step",
                   "reward_error", "actor_loss", "critic_loss", "entropy", "return_scale", "imagined_return")
METRICS_MAY_BE_NAN = dict.fromkeys(LEARNER_METRICS, "learner_ready")
ACTOR_SOURCES = ("imagination", "replay")
WORLD_MODELS = ("mlp", "conv")


def static(default):
    """A dataclass field that is part of the program's structure, not a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """Dreamer hyper-parameters (see the module docstring for what each part does).

    Numeric leaves: learning rates (``model_lr``, ``actor_lr``, ``critic_lr``),
    ``max_grad_norm`` (each optimiser), ``gamma`` / ``lam`` (lambda-returns),
    ``ent_coef``, ``unimix`` (uniform mix of every categorical), the world-model
    loss weights ``recon_coef`` / ``reward_coef`` / ``cont_coef`` / ``dyn_coef``
    / ``rep_coef`` and ``free_nats``, ``return_ema`` (decay of the return-range
    EMA), ``critic_ema`` (decay of the slow critic) and the three dream
    augmentation strengths. Static: sizes, ``train_ratio``, ``actor_source``.
    """

    model_lr: float = 1e-3
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    max_grad_norm: float = 100.0
    gamma: float = 0.99
    lam: float = 0.95
    ent_coef: float = 3e-4
    unimix: float = 0.01
    recon_coef: float = 1.0
    reward_coef: float = 1.0
    cont_coef: float = 1.0
    dyn_coef: float = 0.5
    rep_coef: float = 0.1
    free_nats: float = 1.0
    return_ema: float = 0.99
    critic_ema: float = 0.98
    dream_noise: float = 0.0
    dream_interpolation: float = 0.0
    dream_perturbation: float = 0.0

    total_timesteps: int = static(20_480)
    num_envs: int = static(4)
    num_steps: int = static(16)
    train_ratio: float = static(0.0625)
    capacity_steps: int = static(10_000)
    batch_size: int = static(16)
    seq_len: int = static(32)
    horizon: int = static(15)
    deter_size: int = static(64)
    hidden_size: int = static(64)
    mlp_layers: int = static(2)
    num_latents: int = static(8)
    num_classes: int = static(8)
    actor_source: str = static("imagination")
    world_model: str = static("mlp")  # "mlp", or "conv": a spatial RSSM for (H, W, C) grids
    conv_hidden: int = static(32)  # "conv": width of its 3x3 and per-cell layers
    imagine_starts: int = static(0)  # imagined rollouts per gradient step (0: one per posterior state)

    @property
    def real_steps_per_update(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.real_steps_per_update

    @property
    def grad_steps(self) -> int:
        """World-model (and actor-critic) gradient steps per update: ``train_ratio * real_steps_per_update``."""
        return int(round(self.train_ratio * self.real_steps_per_update))


def validate(config: Config) -> None:
    """Raise ``ValueError("field=value: rule")`` for the first invalid field; runs before tracing."""
    real = config.real_steps_per_update
    steps = config.train_ratio * real
    rules = [
        ("model_lr", config.model_lr > 0, "must be > 0"),
        ("actor_lr", config.actor_lr > 0, "must be > 0"),
        ("critic_lr", config.critic_lr > 0, "must be > 0"),
        ("max_grad_norm", config.max_grad_norm > 0, "must be > 0"),
        ("gamma", 0 <= config.gamma <= 1, "must be in [0, 1]"),
        ("lam", 0 <= config.lam <= 1, "must be in [0, 1]"),
        ("ent_coef", config.ent_coef >= 0, "must be >= 0"),
        ("unimix", 0 <= config.unimix < 1, "must be in [0, 1)"),
        ("recon_coef", config.recon_coef >= 0, "must be >= 0"),
        ("reward_coef", config.reward_coef >= 0, "must be >= 0"),
        ("cont_coef", config.cont_coef >= 0, "must be >= 0"),
        ("dyn_coef", config.dyn_coef >= 0, "must be >= 0"),
        ("rep_coef", config.rep_coef >= 0, "must be >= 0"),
        ("free_nats", config.free_nats >= 0, "must be >= 0"),
        ("return_ema", 0 <= config.return_ema < 1, "must be in [0, 1)"),
        ("critic_ema", 0 <= config.critic_ema < 1, "must be in [0, 1)"),
        ("dream_noise", config.dream_noise >= 0, "must be >= 0 (0: off)"),
        ("dream_interpolation", 0 <= config.dream_interpolation <= 1, "must be in [0, 1] (0: off)"),
        ("dream_perturbation", config.dream_perturbation >= 0, "must be >= 0 (0: off)"),
        ("num_envs", config.num_envs >= 1, "must be >= 1"),
        ("num_steps", config.num_steps >= 1, "must be >= 1"),
        (
            "total_timesteps",
            config.num_envs >= 1 and config.num_steps >= 1 and config.num_updates >= 1,
            f"must be >= one batch (real_steps_per_update=num_envs*num_steps={real})",
        ),
        ("train_ratio", config.train_ratio > 0, "must be > 0"),
        (
            "train_ratio",
            abs(steps - round(steps)) < 1e-6 and round(steps) >= 1,
            f"train_ratio*real_steps_per_update (={steps:g} gradient steps per update, real_steps_per_update="
            f"num_envs*num_steps={real}) must be a positive integer",
        ),
        ("batch_size", config.batch_size >= 1, "must be >= 1"),
        ("seq_len", config.seq_len >= 2, "must be >= 2"),
        ("capacity_steps", config.capacity_steps >= max(config.seq_len, config.num_steps),
         f"must be >= max(seq_len, num_steps)={max(config.seq_len, config.num_steps)}"),
        ("horizon", config.horizon >= 1, "must be >= 1"),
        ("deter_size", config.deter_size >= 1, "must be >= 1"),
        ("hidden_size", config.hidden_size >= 1, "must be >= 1"),
        ("mlp_layers", config.mlp_layers >= 1, "must be >= 1"),
        ("num_latents", config.num_latents >= 1, "must be >= 1"),
        ("num_classes", config.num_classes >= 2, "must be >= 2"),
        ("actor_source", config.actor_source in ACTOR_SOURCES, f"must be one of {list(ACTOR_SOURCES)}"),
        ("world_model", config.world_model in WORLD_MODELS, f"must be one of {list(WORLD_MODELS)}"),
        ("conv_hidden", config.conv_hidden >= 1, "must be >= 1"),
        ("imagine_starts", 0 <= config.imagine_starts <= config.batch_size * config.seq_len,
         f"must be in [0, batch_size*seq_len={config.batch_size * config.seq_len}] (0: every posterior state)"),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


def validate_for_env(config: Config, env, env_params) -> None:
    """The checks that need the environment: discrete actions; vector or (H, W, C) observations."""
    space = env.action_space(env_params)
    if not hasattr(space, "n"):
        raise ValueError("name='dreamer': needs a discrete action space; this environment's actions are "
                         f"continuous ({type(space).__name__} of shape {getattr(space, 'shape', None)})")
    shape = env.observation_space(env_params).shape
    if len(shape) not in (1, 3):
        raise ValueError(f"name='dreamer': needs vector or (H, W, C) observations; this environment's have shape "
                         f"{shape}")
    if config.world_model == "conv" and len(shape) != 3:
        raise ValueError(f"world_model='conv': needs (H, W, C) grid observations; this environment's have shape "
                         f"{shape} (use world_model=mlp)")


# --------------------------------------------------------------------------- pure pieces


def symlog(x):
    return jnp.sign(x) * jnp.log1p(jnp.abs(x))


def symexp(x):
    return jnp.sign(x) * jnp.expm1(jnp.abs(x))


def unimix_logits(logits, mix):
    """Log-probabilities of ``(1 - mix) * softmax(logits) + mix / classes`` (last axis)."""
    probs = (1.0 - mix) * jax.nn.softmax(logits, -1) + mix / logits.shape[-1]
    return jnp.log(probs)


def sample_onehot(key, logits):
    """One-hot sample per categorical (last axis) with straight-through gradients."""
    probs = jax.nn.softmax(logits, -1)
    onehot = jax.nn.one_hot(jax.random.categorical(key, logits), logits.shape[-1])
    return onehot + probs - jax.lax.stop_gradient(probs)


def categorical_kl(p_logits, q_logits):
    """KL(p || q) of ``[..., latents, classes]`` categoricals, summed over latents."""
    p_log = jax.nn.log_softmax(p_logits, -1)
    q_log = jax.nn.log_softmax(q_logits, -1)
    return (jnp.exp(p_log) * (p_log - q_log)).sum((-2, -1))


def kl_loss(post_logits, prior_logits, dyn_coef, rep_coef, free_nats):
    """KL balancing with free nats: ``(loss [...], kl [...])`` per step.

    ``loss = dyn_coef * max(free_nats, KL(sg(post) || prior)) + rep_coef * max(free_nats, KL(post || sg(prior)))``;
    ``kl`` is the unclipped ``KL(post || prior)``.
    """
    sg = jax.lax.stop_gradient
    dyn = categorical_kl(sg(post_logits), prior_logits)
    rep = categorical_kl(post_logits, sg(prior_logits))
    loss = dyn_coef * jnp.maximum(free_nats, dyn) + rep_coef * jnp.maximum(free_nats, rep)
    return loss, sg(rep)


def lambda_returns(rewards, discounts, next_values, lam):
    """TD(lambda) returns over ``[T, ...]``, computed backwards.

    ``R_t = rewards[t] + discounts[t] * ((1 - lam_t) * next_values[t] + lam_t * R_{t+1})``, with
    ``R_T = next_values[T-1]`` (the bootstrap after the last step). ``rewards[t]`` and ``discounts[t]``
    (gamma times continuation) are those of arriving at the state after step ``t``, whose value is
    ``next_values[t]``. ``lam`` is a scalar or an array broadcastable to ``[T, ...]`` (a 0 there
    bootstraps from ``next_values[t]`` alone).
    """
    lam = jnp.broadcast_to(jnp.asarray(lam, rewards.dtype), rewards.shape)

    def body(next_return, step):
        reward, discount, value, lam_t = step
        ret = reward + discount * ((1.0 - lam_t) * value + lam_t * next_return)
        return ret, ret

    _, returns = jax.lax.scan(body, next_values[-1], (rewards, discounts, next_values, lam), reverse=True)
    return returns


class Trajectory(NamedTuple):
    """An imagined rollout, time-major: ``states [H+1, N, ...]`` (``states[0]`` the starts),
    ``actions [H, N]`` (taken at ``states[t]``), ``rewards [H, N]`` and ``conts [H, N]`` (predicted on
    arriving at ``states[t+1]``)."""

    states: Any
    actions: jax.Array
    rewards: jax.Array
    conts: jax.Array


def imagine_with(step_fn, policy_fn, start_states, horizon: int, key) -> Trajectory:
    """Roll ``step_fn`` out for ``horizon`` steps from each start, under ``lax.scan``, vmapped over starts.

    ``policy_fn(state, key) -> action`` and ``step_fn(state, action, key) -> (next_state, reward,
    cont)`` see ONE state (a pytree without the start axis); ``start_states`` has a leading axis ``N``.
    """
    num_starts = jax.tree.leaves(start_states)[0].shape[0]

    def rollout(start, key):
        def body(state, key):
            act_key, step_key = jax.random.split(key)
            action = policy_fn(state, act_key)
            next_state, reward, cont = step_fn(state, action, step_key)
            return next_state, (next_state, action, reward, cont)

        _, (states, actions, rewards, conts) = jax.lax.scan(body, start, jax.random.split(key, horizon))
        states = jax.tree.map(lambda s0, s: jnp.concatenate([s0[None], s], 0), start, states)
        return Trajectory(states, actions, rewards, conts)

    trajectory = jax.vmap(rollout)(start_states, jax.random.split(key, num_starts))
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), trajectory)


def augment_step(deter, key, noise_std, push):
    """One imagined step's augmentation of ``h``: ``h + noise_std * N(0, 1) + push``.

    ``noise_std`` (``dream_noise * std``) broadcasts against ``deter``; ``push`` is the trajectory's
    fixed offset (``dream_perturbation * std * d``). Both 0: exactly ``deter``.
    """
    return deter + noise_std * jax.random.normal(key, deter.shape) + push


def perturbation_push(key, std, num, strength):
    """``[num, D]`` fixed pushes ``strength * std * d``, ``d`` random with unit root-mean-square per feature."""
    d = jax.random.normal(key, (num, std.shape[-1]))
    d = d / jnp.linalg.norm(d, axis=-1, keepdims=True) * jnp.sqrt(std.shape[-1])
    return strength * std * d


def interpolate_states(deter, logits, stoch, partner, a, key):
    """Mix each start ``i`` with start ``partner[i]`` by ``a[i]``: ``(deter, logits, stoch)``.

    ``h' = (1 - a) h + a h[partner]``; class probabilities mixed the same way (``logits``:
    ``[N, latents, classes]`` log-probabilities) and ``stoch`` (``[N, latents*classes]`` one-hot)
    resampled from them where ``a > 0`` (kept where ``a == 0``: exactly the identity there).
    """
    a_col = a[:, None]
    deter = (1.0 - a_col) * deter + a_col * deter[partner]
    probs = jax.nn.softmax(logits, -1)
    mixed = (1.0 - a[:, None, None]) * probs + a[:, None, None] * probs[partner]
    mixed_logits = jnp.log(jnp.maximum(mixed, 1e-30))
    resampled = jax.nn.one_hot(jax.random.categorical(key, mixed_logits), logits.shape[-1]).reshape(stoch.shape)
    stoch = jnp.where(a[:, None] > 0, resampled, stoch)
    return deter, jnp.where(a[:, None, None] > 0, mixed_logits, logits), stoch


def augment_start(key, deter, logits, stoch, batch_shape, strength):
    """Dream interpolation of the ``N = B * T`` flattened starts of a ``[B, T]`` batch.

    Each start is mixed with a uniformly random start of a different sequence (any other sequence; the
    same one when ``B == 1``) by ``a ~ Uniform(0, strength)``. Strength 0: exactly the identity.
    """
    num_seqs, seq_len = batch_shape
    n = num_seqs * seq_len
    seq_key, time_key, a_key, sample_key = jax.random.split(key, 4)
    seq = jnp.arange(n) // seq_len
    shift = jax.random.randint(seq_key, (n,), 1, max(num_seqs, 2)) if num_seqs > 1 else jnp.zeros(n, jnp.int32)
    partner = ((seq + shift) % num_seqs) * seq_len + jax.random.randint(time_key, (n,), 0, seq_len)
    a = jax.random.uniform(a_key, (n,)) * strength
    return interpolate_states(deter, logits, stoch, partner, a, sample_key)


# --------------------------------------------------------------------------- networks


class MLP(nn.Module):
    """``layers`` x (Dense, LayerNorm, SiLU), then a linear head (zero-initialised with ``zero_out``)."""

    hidden: int
    layers: int
    out_dim: int
    zero_out: bool = False

    @nn.compact
    def __call__(self, x):
        for _ in range(self.layers):
            x = nn.silu(nn.LayerNorm()(nn.Dense(self.hidden)(x)))
        init = nn.initializers.zeros if self.zero_out else nn.initializers.lecun_normal()
        return nn.Dense(self.out_dim, kernel_init=init)(x)


def gru_update(parts, deter):
    """The GRU's new state from its normalised gate pre-activations ``parts`` ``[..., 3D]`` and the state
    ``deter`` ``[..., D]``; the update gate is biased toward keeping the state (DreamerV3's ``-1``)."""
    reset, cand, update = jnp.split(parts, 3, -1)
    cand = jnp.tanh(jax.nn.sigmoid(reset) * cand)
    update = jax.nn.sigmoid(update - 1.0)
    return update * cand + (1.0 - update) * deter


class WorldModel(nn.Module):
    """Encoder, RSSM (layer-normalised GRU + categorical latents) and the three heads."""

    obs_dim: int
    action_dim: int
    deter: int
    hidden: int
    layers: int
    latents: int
    classes: int

    def setup(self):
        self.encoder = MLP(self.hidden, self.layers, self.hidden)
        self.img_in = nn.Dense(self.hidden)
        self.img_norm = nn.LayerNorm()
        self.gru = nn.Dense(3 * self.deter)
        self.gru_norm = nn.LayerNorm()
        self.prior_net = MLP(self.hidden, 1, self.latents * self.classes)
        self.post_net = MLP(self.hidden, 1, self.latents * self.classes)
        self.decoder = MLP(self.hidden, self.layers, self.obs_dim)
        self.reward_head = MLP(self.hidden, self.layers, 1, zero_out=True)
        self.cont_head = MLP(self.hidden, self.layers, 1)

    def __call__(self, obs, deter, stoch, action):
        embed = self.encode(obs)
        deter = self.core(deter, stoch, action)
        return self.prior(deter), self.posterior(deter, embed), self.heads(jnp.concatenate([deter, stoch], -1))

    def encode(self, obs):
        return self.encoder(symlog(obs))

    def core(self, deter, stoch, action_onehot):
        """GRU step ``h' = f(h, z, a)``."""
        x = nn.silu(self.img_norm(self.img_in(jnp.concatenate([stoch, action_onehot], -1))))
        return gru_update(self.gru_norm(self.gru(jnp.concatenate([x, deter], -1))), deter)

    def prior(self, deter):
        return self.prior_net(deter).reshape(deter.shape[:-1] + (self.latents, self.classes))

    def posterior(self, deter, embed):
        out = self.post_net(jnp.concatenate([deter, embed], -1))
        return out.reshape(deter.shape[:-1] + (self.latents, self.classes))

    def heads(self, feat):
        """``(symlog obs [..., obs_dim], symlog reward [...], continuation logit [...])``."""
        return self.decoder(feat), self.reward_head(feat)[..., 0], self.cont_head(feat)[..., 0]


def neighbourhoods(x):
    """``[..., H, W, C] -> [..., H, W, 9C]``: each cell's 3x3 neighbourhood (zeros beyond the grid).

    A dense layer on these is a 3x3 convolution; XLA's CPU backend runs it faster than ``nn.Conv``.
    """
    pad = [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)]
    padded = jnp.pad(x, pad)
    height, width = x.shape[-3], x.shape[-2]
    return jnp.concatenate([padded[..., r:r + height, c:c + width, :] for r in range(3) for c in range(3)], -1)


class ConvWorldModel(nn.Module):
    """A spatial RSSM for ``(H, W, C)`` grids: every cell has its own deterministic state and categoricals.

    Same interface as ``WorldModel`` (flat vectors in and out), so imagination, the actor-critic and the
    dream augmentations do not change. A step is local: one 3x3 layer reads each cell's neighbourhood of
    ``[h, z, action]`` and a per-cell GRU updates ``h``, so moving an object one cell is a shift the same
    weights make everywhere, on any level (a flat MLP has to learn it for each position separately).
    Prior, posterior and decoder work per cell; the reward and continuation heads pool per-cell features
    (max and mean over the grid), since an event such as "the agent stands on the goal" happens in one cell.
    """

    grid: tuple  # (H, W, C)
    action_dim: int
    deter: int  # channels of h per cell
    hidden: int  # width of the MLP parts of the heads
    conv_hidden: int
    latents: int  # categoricals per cell
    classes: int

    def setup(self):
        self.encoder_in = nn.Dense(self.conv_hidden)
        self.encoder_out = nn.Dense(self.conv_hidden)
        self.img_in = nn.Dense(self.conv_hidden)
        self.img_norm = nn.LayerNorm()
        self.gru = nn.Dense(3 * self.deter)
        self.gru_norm = nn.LayerNorm()
        self.prior_net = MLP(self.conv_hidden, 1, self.latents * self.classes)
        self.post_net = MLP(self.conv_hidden, 1, self.latents * self.classes)
        self.decoder = MLP(self.conv_hidden, 1, self.grid[2])
        self.event_net = nn.Dense(self.conv_hidden)
        self.reward_head = MLP(self.hidden, 1, 1, zero_out=True)
        self.cont_head = MLP(self.hidden, 1, 1)

    def __call__(self, obs, deter, stoch, action):
        embed = self.encode(obs)
        deter = self.core(deter, stoch, action)
        return self.prior(deter), self.posterior(deter, embed), self.heads(jnp.concatenate([deter, stoch], -1))

    def cells(self, x):
        return x.reshape(x.shape[:-1] + self.grid[:2] + (-1,))

    def flat(self, x):
        return x.reshape(x.shape[:-3] + (-1,))

    def encode(self, obs):
        x = nn.silu(self.encoder_in(neighbourhoods(self.cells(symlog(obs)))))
        return self.flat(self.encoder_out(x))

    def core(self, deter, stoch, action_onehot):
        """``h' = f(h, z, a)`` per cell, reading the 3x3 neighbourhood of ``[h, z, a]``."""
        h, z = self.cells(deter), self.cells(stoch)
        a = jnp.broadcast_to(action_onehot[..., None, None, :], h.shape[:-1] + (self.action_dim,))
        x = nn.silu(self.img_norm(self.img_in(neighbourhoods(jnp.concatenate([h, z, a], -1)))))
        return self.flat(gru_update(self.gru_norm(self.gru(jnp.concatenate([x, h], -1))), h))

    def prior(self, deter):
        out = self.prior_net(self.cells(deter))
        return out.reshape(deter.shape[:-1] + (-1, self.classes))

    def posterior(self, deter, embed):
        out = self.post_net(jnp.concatenate([self.cells(deter), self.cells(embed)], -1))
        return out.reshape(deter.shape[:-1] + (-1, self.classes))

    def heads(self, feat):
        """``(symlog obs [..., H*W*C], symlog reward [...], continuation logit [...])``."""
        split = int(np.prod(self.grid[:2])) * self.deter
        x = jnp.concatenate([self.cells(feat[..., :split]), self.cells(feat[..., split:])], -1)
        events = nn.silu(self.event_net(x))
        pooled = jnp.concatenate([events.max((-3, -2)), events.mean((-3, -2))], -1)
        return self.flat(self.decoder(x)), self.reward_head(pooled)[..., 0], self.cont_head(pooled)[..., 0]


class Actor(nn.Module):
    hidden: int
    layers: int
    action_dim: int

    @nn.compact
    def __call__(self, feat):
        return MLP(self.hidden, self.layers, self.action_dim)(feat)


class Critic(nn.Module):
    """Predicts ``symlog`` of the value."""

    hidden: int
    layers: int

    @nn.compact
    def __call__(self, feat):
        return MLP(self.hidden, self.layers, 1, zero_out=True)(feat)[..., 0]


# --------------------------------------------------------------------------- state


class Latent(NamedTuple):
    deter: jax.Array  # [..., deter_size] (world_model="conv": times the grid's cells)
    stoch: jax.Array  # [..., num_latents * num_classes] (the same), one-hot per latent


class Dataset(NamedTuple):
    """Real experience, ``[T, num_envs, ...]`` each, in the arrival convention (module docstring)."""

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    is_first: jax.Array


class Buffer(NamedTuple):
    """Sequence replay: ``data`` is a ``Dataset`` of ``[capacity_steps, num_envs, ...]`` arrays, ring-indexed
    by time; ``position`` is the next time index written, ``size`` the filled time steps."""

    data: Dataset
    position: jax.Array
    size: jax.Array


class Policy(NamedTuple):
    """What acting needs: the world model (for the posterior) and the actor."""

    model: Any
    actor: Any


class Carry(NamedTuple):
    """A recurrent actor's memory: the last posterior latent and the action taken from it."""

    latent: Latent
    action: jax.Array


class Learner(NamedTuple):
    """Everything trained: parameters, optimiser states, slow critic, return-range EMA."""

    model: Any
    model_opt: Any
    actor: Any
    actor_opt: Any
    critic: Any
    critic_opt: Any
    slow_critic: Any
    return_range: jax.Array


class TrainState(struct.PyTreeNode):
    learner: Learner
    buffer: Buffer
    env_state: Any
    obs: jax.Array  # per env: the observation the next slot records
    reward: jax.Array  # ... the reward of arriving at it
    terminated: jax.Array
    is_first: jax.Array
    prev_action: jax.Array  # ... the action that led to it
    pending: jax.Array  # per env: ``obs`` ends its episode; the next slot records ``pending_obs`` (reset)
    pending_obs: jax.Array
    latent: Latent  # per env, posterior of the previous slot
    episode_return: jax.Array
    last_episode_return: jax.Array
    key: jax.Array
    update_step: jax.Array
    env_steps: jax.Array

    @property
    def policy(self) -> Policy:
        return Policy(self.learner.model, self.learner.actor)

    @property
    def model_params(self):
        return self.learner.model


class Agent(NamedTuple):
    init: Callable  # key -> TrainState
    update: Callable  # TrainState -> (TrainState, metrics)
    act: Callable  # (Policy, Carry, obs, reset, key, greedy) -> (Carry, action)
    init_carry: Callable  # batch_size -> zero Carry
    imagine: Callable  # (model_params, actor_params, start Latent [N], horizon, key, noise_std, push) -> Trajectory
    observe: Callable  # (model_params, Dataset [T, B], key) -> (posterior Latent, post logits, prior logits)
    multistep_error: Callable  # (model_params, Dataset [T, B], horizons, context) -> [len(horizons)]
    train_step: Callable  # (Learner, Buffer, key) -> (Learner, metrics): one gradient step of each part
    fill: Callable  # (TrainState, Dataset) -> TrainState with the dataset in its buffer
    collect: Callable  # (TrainState, Policy | None, num_steps) -> (TrainState, Dataset); None: uniform actions
    start_states: Callable  # (TrainState, key) -> Latent [batch_size * seq_len]: posteriors of a sampled batch


def _select(flag, new, old):
    return jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)


# --------------------------------------------------------------------------- the agent


def make(config: Config, env, env_params) -> Agent:
    """Build Dreamer's pure functions for one environment (discrete actions)."""
    validate_for_env(config, env, env_params)
    action_dim = int(env.action_space(env_params).n)
    obs_shape = tuple(env.observation_space(env_params).shape)
    obs_dim = int(np.prod(obs_shape))
    obs_axes = len(obs_shape)
    classes = config.num_classes
    if config.world_model == "conv":  # deter_size and num_latents count per cell
        cells = obs_shape[0] * obs_shape[1]
        world = ConvWorldModel(obs_shape, action_dim, config.deter_size, config.hidden_size, config.conv_hidden,
                               config.num_latents, classes)
        deter_dim, latents = cells * config.deter_size, cells * config.num_latents
    else:
        world = WorldModel(obs_dim, action_dim, config.deter_size, config.hidden_size, config.mlp_layers,
                           config.num_latents, classes)
        deter_dim, latents = config.deter_size, config.num_latents
    stoch_dim = latents * classes
    actor_net = Actor(config.hidden_size, config.mlp_layers, action_dim)
    critic_net = Critic(config.hidden_size, config.mlp_layers)
    feat_dim = deter_dim + stoch_dim
    grad_steps = config.grad_steps
    sg = jax.lax.stop_gradient

    def optimizer(lr):
        return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-8))

    model_opt, actor_opt, critic_opt = optimizer(config.model_lr), optimizer(config.actor_lr), \
        optimizer(config.critic_lr)

    def flat(obs):
        return obs.reshape(obs.shape[: obs.ndim - obs_axes] + (obs_dim,)).astype(jnp.float32)

    def feat(latent: Latent):
        return jnp.concatenate([latent.deter, latent.stoch], -1)

    def zeros_latent(batch_shape):
        return Latent(jnp.zeros(batch_shape + (deter_dim,)), jnp.zeros(batch_shape + (stoch_dim,)))

    def mixed(logits):
        return unimix_logits(logits, config.unimix)

    def posterior_step(params, latent: Latent, action, embed, reset, key):
        """``(latent, post logits, deter)`` after reading one observation; ``reset`` zeroes the memory."""
        keep = (1.0 - reset.astype(jnp.float32))[..., None]
        latent = Latent(latent.deter * keep, latent.stoch * keep)
        onehot = jax.nn.one_hot(action, action_dim) * keep
        deter = world.apply(params, latent.deter, latent.stoch, onehot, method="core")
        logits = mixed(world.apply(params, deter, embed, method="posterior"))
        stoch = sample_onehot(key, logits).reshape(deter.shape[:-1] + (stoch_dim,))
        return Latent(deter, stoch), logits

    # ------------------------------------------------------------------ acting

    def init_carry(batch_size: int | None = None):
        shape = () if batch_size is None else (batch_size,)
        return Carry(zeros_latent(shape), jnp.zeros(shape, jnp.int32))

    def act(policy: Policy, carry: Carry, obs, reset, key, greedy: bool = False):
        """Read ``obs`` (memory zeroed where ``reset``) and pick an action; returns ``(carry, action)``."""
        post_key, act_key = jax.random.split(key)
        embed = world.apply(policy.model, flat(obs), method="encode")
        latent, _ = posterior_step(policy.model, carry.latent, carry.action, embed, jnp.asarray(reset), post_key)
        logits = actor_net.apply(policy.actor, feat(latent))
        action = jnp.argmax(logits, -1) if greedy else jax.random.categorical(act_key, logits)
        return Carry(latent, action), action

    # ------------------------------------------------------------------ world model

    def observe(params, data: Dataset, key):
        """Posterior latents ``[T, B]`` of sequences (memory zeroed at ``t = 0`` and wherever ``is_first``)."""
        embed = world.apply(params, flat(data.obs), method="encode")
        reset = data.is_first.at[0].set(1.0)

        def step(latent, inputs):
            action, emb, first, k = inputs
            latent, logits = posterior_step(params, latent, action, emb, first, k)
            return latent, (latent, logits)

        keys = jax.random.split(key, data.reward.shape[0])
        _, (posts, post_logits) = jax.lax.scan(step, zeros_latent(data.reward.shape[1:]),
                                               (data.action, embed, reset, keys))
        prior_logits = mixed(world.apply(params, posts.deter, method="prior"))
        return posts, post_logits, prior_logits

    def model_loss(params, data: Dataset, key):
        posts, post_logits, prior_logits = observe(params, data, key)
        obs_pred, reward_pred, cont_logit = world.apply(params, feat(posts), method="heads")
        target_obs = symlog(flat(data.obs))
        recon = ((obs_pred - target_obs) ** 2).sum(-1).mean()
        reward_loss = ((reward_pred - symlog(data.reward)) ** 2).mean()
        cont_loss = optax.sigmoid_binary_cross_entropy(cont_logit, 1.0 - data.terminated).mean()
        kl_terms, kl = kl_loss(post_logits, prior_logits, config.dyn_coef, config.rep_coef, config.free_nats)
        loss = config.recon_coef * recon + config.reward_coef * reward_loss + config.cont_coef * cont_loss \
            + kl_terms.mean()
        # one-step prior prediction: h_t from the previous posterior and the real action, z_t = prior mode
        prior_stoch = jax.nn.one_hot(jnp.argmax(prior_logits, -1), classes).reshape(posts.stoch.shape)
        prior_obs, prior_reward, _ = world.apply(params, sg(jnp.concatenate([posts.deter, prior_stoch], -1)),
                                                 method="heads")
        valid = 1.0 - data.is_first.at[0].set(1.0)
        count = jnp.maximum(valid.sum(), 1.0)
        obs_error = ((symexp(prior_obs) - flat(data.obs)) ** 2).mean(-1)
        metrics = {
            "model_loss": loss, "recon_loss": recon, "reward_loss": reward_loss, "cont_loss": cont_loss,
            "kl": kl.mean(),
            "model_error_1step": sg((obs_error * valid).sum() / count),
            "reward_error": sg((((symexp(prior_reward) - data.reward) ** 2) * valid).sum() / count),
        }
        return loss, (posts, post_logits, metrics)

    model_grad = jax.value_and_grad(model_loss, has_aux=True)

    def multistep_error(params, data: Dataset, horizons: tuple, context: int, key=None):
        """Open-loop error per horizon: observe ``context`` steps of each sequence ``[T, B]``, then predict
        ahead with the prior (real actions, prior modes); returns the mean squared error per observation
        feature of the decoded prediction at ``context - 1 + h`` for each ``h`` in ``horizons``, counting only
        sequences with no episode start in ``[context, context - 1 + h]`` (NaN where none is left: no error
        was measured, and 0 would read as a perfect prediction)."""
        key = jax.random.PRNGKey(0) if key is None else key
        posts, _, _ = observe(params, jax.tree.map(lambda x: x[:context], data), key)
        start = jax.tree.map(lambda x: x[-1], posts)
        max_h = max(horizons)

        def step(latent, action):
            deter = world.apply(params, latent.deter, latent.stoch, jax.nn.one_hot(action, action_dim),
                                method="core")
            logits = world.apply(params, deter, method="prior")
            stoch = jax.nn.one_hot(jnp.argmax(logits, -1), classes).reshape(latent.stoch.shape)
            latent = Latent(deter, stoch)
            return latent, world.apply(params, feat(latent), method="heads")[0]

        _, preds = jax.lax.scan(step, start, data.action[context:context + max_h])
        target = flat(data.obs[context:context + max_h])
        errors = ((symexp(preds) - target) ** 2).mean(-1)  # [max_h, B]
        alive = jnp.cumprod(1.0 - data.is_first[context:context + max_h], 0)
        sums = jnp.stack([(errors[h - 1] * alive[h - 1]).sum() for h in horizons])
        counts = jnp.stack([alive[h - 1].sum() for h in horizons])
        return jnp.where(counts > 0, sums / jnp.maximum(counts, 1.0), jnp.nan)

    # ------------------------------------------------------------------ imagination

    def imagine(model_params, actor_params, start_states: Latent, horizon: int, key, noise_std=None, push=None):
        """Imagined rollouts from ``start_states`` (``Latent [N]``) under the actor (its parameters, or a
        ``Policy``); ``noise_std [D]`` and ``push [N, D]`` are the dream augmentations of ``augment_step``
        (None: classic imagination)."""
        if isinstance(actor_params, Policy):
            actor_params = actor_params.actor
        num = start_states.deter.shape[0]
        noise_std = jnp.zeros(deter_dim) if noise_std is None else noise_std
        push = jnp.zeros((num, deter_dim)) if push is None else push

        def policy_fn(state, key):
            latent, _ = state
            return jax.random.categorical(key, actor_net.apply(actor_params, feat(latent)))

        def step_fn(state, action, key):
            latent, push_i = state
            noise_key, sample_key = jax.random.split(key)
            deter = world.apply(model_params, latent.deter, latent.stoch, jax.nn.one_hot(action, action_dim),
                                method="core")
            deter = augment_step(deter, noise_key, noise_std, push_i)
            logits = mixed(world.apply(model_params, deter, method="prior"))
            stoch = sample_onehot(sample_key, logits).reshape(latent.stoch.shape)
            nxt = Latent(deter, stoch)
            _, reward, cont_logit = world.apply(model_params, feat(nxt), method="heads")
            return (nxt, push_i), symexp(reward), jax.nn.sigmoid(cont_logit)

        traj = imagine_with(step_fn, policy_fn, (start_states, push), horizon, key)
        return traj._replace(states=traj.states[0])

    # ------------------------------------------------------------------ actor-critic

    def actor_critic_losses(actor_params, critic_params, learner: Learner, feats, actions, returns, weights):
        """REINFORCE and symlog critic losses over ``[T, N]`` decision points with slow-critic baselines."""
        logits = actor_net.apply(actor_params, feats)
        log_p = jax.nn.log_softmax(logits, -1)
        log_prob = jnp.take_along_axis(log_p, actions[..., None], -1)[..., 0]
        entropy = -(jnp.exp(log_p) * log_p).sum(-1)
        baseline = symexp(critic_net.apply(learner.slow_critic, feats))
        scale = jnp.maximum(1.0, learner.return_range)
        advantage = sg((returns - baseline) / scale)
        total = jnp.maximum(weights.sum(), 1e-8)
        actor_loss = -((log_prob * advantage + config.ent_coef * entropy) * weights).sum() / total
        value = critic_net.apply(critic_params, feats)
        critic_loss = 0.5 * (((value - symlog(sg(returns))) ** 2) * weights).sum() / total
        return actor_loss, critic_loss, (entropy * weights).sum() / total

    def ac_targets(learner: Learner, posts: Latent, post_logits, data: Dataset, key):
        """(feats [T, N, F], actions [T, N], returns [T, N], weights [T, N], first returns) per actor source."""
        slow_value = lambda f: symexp(critic_net.apply(learner.slow_critic, f))  # noqa: E731
        if config.actor_source == "replay":
            feats = feat(posts)  # [T, B]
            values = slow_value(feats)
            first, term = data.is_first, data.terminated
            valid = (1.0 - first[1:]) * (1.0 - term[:-1])  # transition t -> t+1 inside an episode
            lam = config.lam * jnp.concatenate([valid[1:], jnp.zeros_like(valid[:1])], 0)
            returns = lambda_returns(data.reward[1:] * valid, config.gamma * (1.0 - term[1:]), values[1:], lam)
            return feats[:-1], data.action[1:], returns, valid, returns[0]
        num_seqs, seq_len = data.reward.shape[1], data.reward.shape[0]
        n = num_seqs * seq_len
        # flatten batch-major so that start i belongs to sequence i // seq_len
        to_starts = lambda x: jnp.swapaxes(x, 0, 1).reshape((n,) + x.shape[2:])  # noqa: E731
        deter, stoch, logits = to_starts(posts.deter), to_starts(posts.stoch), to_starts(post_logits)
        start_cont = 1.0 - to_starts(data.terminated)
        if config.imagine_starts:
            key, pick_key = jax.random.split(key)
        interp_key, push_key, imag_key = jax.random.split(key, 3)
        std = jnp.std(deter, 0)
        deter, _, stoch = augment_start(interp_key, deter, logits, stoch, (num_seqs, seq_len),
                                       config.dream_interpolation)
        push = perturbation_push(push_key, std, n, config.dream_perturbation)
        if config.imagine_starts:  # a random subset of the starts (imagination dominates a step's compute)
            pick = jax.random.choice(pick_key, n, (config.imagine_starts,), replace=False)
            deter, stoch, start_cont, push = deter[pick], stoch[pick], start_cont[pick], push[pick]
        traj = imagine(learner.model, learner.actor, Latent(deter, stoch), config.horizon, imag_key,
                       config.dream_noise * std, push)
        feats = feat(traj.states)  # [H+1, N]
        values = slow_value(feats)
        returns = lambda_returns(traj.rewards, config.gamma * traj.conts, values[1:], config.lam)
        weights = jnp.cumprod(jnp.concatenate([start_cont[None], traj.conts[:-1]], 0), 0)
        return feats[:-1], traj.actions, returns, weights, returns[0]

    ac_grad = jax.value_and_grad(
        lambda params, learner, *args: (lambda a, c, e: (a + c, (a, c, e)))(
            *actor_critic_losses(params[0], params[1], learner, *args)), has_aux=True)

    # ------------------------------------------------------------------ one gradient step of each part

    def sample(buffer: Buffer, key) -> Dataset:
        """``batch_size`` sequences ``[seq_len, batch_size]`` uniformly from the filled part."""
        env_key, offset_key = jax.random.split(key)
        size = buffer.size
        env_index = jax.random.randint(env_key, (config.batch_size,), 0, config.num_envs)
        offset = jax.random.randint(offset_key, (config.batch_size,), 0, jnp.maximum(size - config.seq_len + 1, 1))
        oldest = (buffer.position - size) % config.capacity_steps
        time = (oldest + offset[None, :] + jnp.arange(config.seq_len)[:, None]) % config.capacity_steps
        return jax.tree.map(lambda x: x[time, env_index[None, :]], buffer.data)

    def train_step(learner: Learner, buffer: Buffer, key):
        sample_key, model_key, ac_key = jax.random.split(key, 3)
        data = sample(buffer, sample_key)
        (_, (posts, post_logits, metrics)), grads = model_grad(learner.model, data, model_key)
        updates, model_state = model_opt.update(grads, learner.model_opt, learner.model)
        model_params = optax.apply_updates(learner.model, updates)
        learner = learner._replace(model=model_params, model_opt=model_state)

        posts, post_logits = sg(posts), sg(post_logits)
        feats, actions, returns, weights, first_returns = ac_targets(learner, posts, post_logits, data, ac_key)
        feats, returns, weights = sg(feats), sg(returns), sg(weights)
        spread = jnp.percentile(returns, 95) - jnp.percentile(returns, 5)
        return_range = config.return_ema * learner.return_range + (1.0 - config.return_ema) * spread
        learner = learner._replace(return_range=return_range)
        (_, (actor_loss, critic_loss, entropy)), (actor_grads, critic_grads) = ac_grad(
            (learner.actor, learner.critic), learner, feats, actions, returns, weights)
        updates, actor_state = actor_opt.update(actor_grads, learner.actor_opt, learner.actor)
        actor_params = optax.apply_updates(learner.actor, updates)
        updates, critic_state = critic_opt.update(critic_grads, learner.critic_opt, learner.critic)
        critic_params = optax.apply_updates(learner.critic, updates)
        slow = jax.tree.map(lambda s, c: config.critic_ema * s + (1.0 - config.critic_ema) * c,
                            learner.slow_critic, critic_params)
        learner = learner._replace(actor=actor_params, actor_opt=actor_state, critic=critic_params,
                                   critic_opt=critic_state, slow_critic=slow)
        metrics.update(actor_loss=actor_loss, critic_loss=critic_loss, entropy=entropy,
                       return_scale=jnp.maximum(1.0, return_range), imagined_return=first_returns.mean())
        return learner, metrics

    def train_many(learner: Learner, buffer: Buffer, key, num: int):
        def body(learner, key):
            return train_step(learner, buffer, key)

        return jax.lax.scan(body, learner, jax.random.split(key, num))

    # ------------------------------------------------------------------ real experience

    def collect_step(state: TrainState, policy_params, uniform: bool):
        """One slot per env: record ``state.obs``, act from its posterior, step (or emit the pending reset)."""
        key, post_key, act_key, step_key = jax.random.split(state.key, 4)
        entry = Dataset(state.obs, state.prev_action, state.reward, state.terminated, state.is_first)
        if uniform:
            latent = state.latent
            action = jax.random.randint(act_key, (config.num_envs,), 0, action_dim)
        else:
            embed = world.apply(policy_params.model, flat(state.obs), method="encode")
            latent, _ = posterior_step(policy_params.model, state.latent, state.prev_action, embed, state.is_first,
                                       post_key)
            logits = actor_net.apply(policy_params.actor, feat(latent))
            action = jax.random.categorical(act_key, logits)
        step_keys = jax.random.split(step_key, config.num_envs)
        next_obs, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            step_keys, state.env_state, action, env_params)
        reward = reward.astype(jnp.float32)
        terminated = terminated.astype(jnp.float32)
        done = jnp.logical_or(terminated > 0, truncated)
        pending = state.pending

        def per_env(flag, a, b):
            return jnp.where(flag.reshape(flag.shape + (1,) * (a.ndim - 1)), a, b)

        arrived = per_env(done, info["final_observation"].astype(state.obs.dtype), next_obs.astype(state.obs.dtype))
        episode_return = state.episode_return + reward
        state = state.replace(
            obs=per_env(pending, state.pending_obs, arrived),
            env_state=jax.tree.map(lambda old, new: per_env(pending, old, new), state.env_state, env_state),
            reward=jnp.where(pending, 0.0, reward),
            terminated=jnp.where(pending, 0.0, terminated),
            is_first=pending.astype(jnp.float32),
            prev_action=jnp.where(pending, 0, action).astype(jnp.int32),
            pending=jnp.logical_and(~pending, done),
            pending_obs=per_env(jnp.logical_and(~pending, done), next_obs.astype(state.obs.dtype), state.pending_obs),
            latent=latent,
            episode_return=jnp.where(pending, 0.0, jnp.where(done, 0.0, episode_return)),
            last_episode_return=jnp.where(~pending & done, episode_return, state.last_episode_return),
            key=key,
        )
        return state, entry

    def store(buffer: Buffer, traj: Dataset) -> Buffer:
        steps = traj.reward.shape[0]
        index = (buffer.position + jnp.arange(steps)) % config.capacity_steps
        data = jax.tree.map(lambda b, x: b.at[index].set(x.astype(b.dtype)), buffer.data, traj)
        return Buffer(data, (buffer.position + steps) % config.capacity_steps,
                      jnp.minimum(buffer.size + steps, config.capacity_steps))

    def fill(state: TrainState, dataset: Dataset) -> TrainState:
        """``state`` with ``dataset`` (``[T, num_envs, ...]``; the newest ``capacity_steps`` kept) in its buffer."""
        dataset = jax.tree.map(lambda x: x[-config.capacity_steps:], dataset)
        return state.replace(buffer=store(state.buffer, dataset))

    # ------------------------------------------------------------------ init and update

    def init(key) -> TrainState:
        model_key, actor_key, critic_key, env_key, key = jax.random.split(key, 5)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(env_key, config.num_envs), env_params)
        obs = obs.astype(jnp.float32)
        dummy = zeros_latent(())
        model = world.init(model_key, jnp.zeros(obs_dim), dummy.deter, dummy.stoch, jnp.zeros(action_dim))
        actor = actor_net.init(actor_key, jnp.zeros(feat_dim))
        critic = critic_net.init(critic_key, jnp.zeros(feat_dim))
        learner = Learner(model, model_opt.init(model), actor, actor_opt.init(actor), critic, critic_opt.init(critic),
                          critic, jnp.asarray(0.0))
        cap, n = config.capacity_steps, config.num_envs
        data = Dataset(jnp.zeros((cap, n) + obs_shape), jnp.zeros((cap, n), jnp.int32), jnp.zeros((cap, n)),
                       jnp.zeros((cap, n)), jnp.zeros((cap, n)))
        zeros = jnp.zeros(n)
        return TrainState(
            learner=learner,
            buffer=Buffer(data, jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32)),
            env_state=env_state, obs=obs, reward=zeros, terminated=zeros, is_first=jnp.ones(n),
            prev_action=jnp.zeros(n, jnp.int32), pending=jnp.zeros(n, bool), pending_obs=obs,
            latent=zeros_latent((n,)), episode_return=zeros, last_episode_return=zeros, key=key,
            update_step=jnp.asarray(0, jnp.int32), env_steps=jnp.asarray(0, jnp.int32),
        )

    def update(state: TrainState):
        policy = state.policy
        state, traj = jax.lax.scan(lambda s, _: collect_step(s, policy, False), state, None, config.num_steps)
        key, train_key = jax.random.split(state.key)
        buffer = store(state.buffer, traj)
        learner, metrics = train_many(state.learner, buffer, train_key, grad_steps)
        ready = buffer.size >= config.seq_len
        learner = _select(ready, learner, state.learner)
        metrics = jax.tree.map(lambda values: jnp.where(ready, values.mean(), jnp.nan), metrics)
        metrics["learner_ready"] = ready.astype(jnp.float32)
        state = state.replace(learner=learner, buffer=buffer, key=key, update_step=state.update_step + 1,
                              env_steps=state.env_steps + config.real_steps_per_update)
        metrics["train_return"] = state.last_episode_return.mean()
        metrics["train_ratio"] = jnp.asarray(grad_steps / config.real_steps_per_update, jnp.float32)
        return state, metrics

    def collect(state: TrainState, policy: Policy | None, num_steps: int):
        """``num_steps`` slots per env with ``policy`` (None: uniformly random actions): ``(state, Dataset)``."""
        return jax.lax.scan(lambda s, _: collect_step(s, policy, policy is None), state, None, num_steps)

    def start_states(state: TrainState, key) -> Latent:
        """Posterior states ``[batch_size * seq_len]`` of a batch sampled from the buffer (imagination's starts)."""
        sample_key, observe_key = jax.random.split(key)
        posts, _, _ = observe(state.learner.model, sample(state.buffer, sample_key), observe_key)
        return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:]), posts)

    return Agent(init, update, act, init_carry, imagine, observe, multistep_error, train_step, fill, collect,
                 start_states)


def collect(config: Config, env, env_params, key, num_steps: int, policy: Policy | None = None) -> Dataset:
    """A ``Dataset`` of ``num_steps`` slots x ``config.num_envs`` envs from fresh environments, acting with
    ``policy`` (a ``state.policy``) or, with None, uniformly at random."""
    agent = make(config, env, env_params)
    return jax.jit(lambda key: agent.collect(agent.init(key), policy, num_steps)[1])(key)


def train_from_dataset(config: Config, env, env_params, dataset: Dataset, key, grad_steps: int):
    """Fill a fresh agent's buffer with ``dataset`` and make ``grad_steps`` gradient steps (world model and
    actor-critic each) without collecting real data. Returns ``(state, metrics)``, metrics ``[grad_steps]``."""
    agent = make(config, env, env_params)

    def run(dataset, key):
        init_key, train_key = jax.random.split(key)
        state = agent.fill(agent.init(init_key), dataset)
        learner, metrics = jax.lax.scan(lambda l, k: agent.train_step(l, state.buffer, k), state.learner,
                                        jax.random.split(train_key, grad_steps))
        return state.replace(learner=learner), metrics

    dataset = Dataset(**dataset) if isinstance(dataset, dict) else Dataset(*dataset)
    return jax.jit(run)(dataset, key)


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


# ``--small``: networks and batches a few times smaller, compiling in a fraction of the time; for a
# quick check that the file runs where it was copied (they do not learn CartPole).
SMALL = dict(deter_size=32, hidden_size=32, mlp_layers=1, num_latents=4, num_classes=4, batch_size=4, seq_len=8,
             horizon=5, num_envs=2, num_steps=8, train_ratio=0.125, capacity_steps=64)


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

    parser = argparse.ArgumentParser(description="Train Dreamer (actor-critic in imagination) on gymnax CartPole-v1.")
    parser.add_argument("--timesteps", type=int, default=Config().total_timesteps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="tiny networks: checks that the file runs, does not learn")
    args = parser.parse_args()
    env = CartPole()
    config = cartpole_config(total_timesteps=args.timesteps, **(SMALL if args.small else {}))
    validate(config)
    start = time.perf_counter()
    state, metrics = train(config, env, env.default_params, jax.random.PRNGKey(args.seed))
    metrics = jax.tree.map(np.asarray, metrics)
    returns = metrics["train_return"]
    step = max(1, len(returns) // 10)
    for i in range(step - 1, len(returns), step):
        print(f"update {i + 1:5d}  env steps {(i + 1) * config.real_steps_per_update:7d}  "
              f"train return {returns[i]:6.1f}  model loss {metrics['model_loss'][i]:7.3f}  "
              f"imagined return {metrics['imagined_return'][i]:6.2f}")
    print(f"final train return {returns[-1]:.1f} in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    _cli()
