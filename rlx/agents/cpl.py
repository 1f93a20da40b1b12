"""Offline Contrastive Preference Learning (CPL) and behaviour-cloning baselines in one file.

Vendorable: this file imports only jax, flax, optax and numpy. Copy it into your
project and run ``python cpl.py`` to build a small CartPole preference dataset
(a scripted controller that errs on purpose at several rates) and learn a
policy from the oracle's labels alone (``--objective bc_all`` for the
behaviour-cloning baseline, which copies the errors too).

CPL (Hejna et al. 2023, "Contrastive Preference Learning: Learning from Human
Feedback without RL") learns a policy directly from preferences between segments,
with no reward model and no RL: under the regret-based preference model the
optimal advantage is ``alpha * log pi(a|s)``, so a segment's score is

    score(sigma) = alpha * sum_t gamma**t * log pi(a_t | s_t)

and the policy is fitted with a Bradley-Terry (logistic) loss on the scores of
each labelled pair. With the conservative bias ``lambda`` in (0, 1] the
dispreferred segment's score is multiplied by ``lambda`` (``lambda = 1`` is the
plain contrastive loss; below 1 the loss pushes the preferred segment's
likelihood up more than the dispreferred one's down). A pair with label ``y``
(probability that the *second* segment is preferred) contributes

    y * softplus(lambda * s0 - s1) + (1 - y) * softplus(lambda * s1 - s0)

so a tie (``y = 0.5``) is half of each; pairs with ``mask`` 0 count for nothing.
``bc_weight`` adds the mean negative log-likelihood of the preferred segments'
actions (both segments of a tie) as a regulariser.

``objective`` (static) picks the loss: ``cpl``; ``bc_all`` (behaviour cloning
of every action in the dataset: segments drawn uniformly, labels ignored) or
``bc_preferred`` (behaviour cloning of the preferred segment of each unmasked
pair; both segments of a tie).

Data (``Data``, arrays, leading axes ``S`` segments of ``L`` steps and ``P``
pairs): ``obs [S, L, *obs_shape]``, ``actions [S, L]`` (int, discrete) or
``[S, L, action_dim]`` (float, continuous, inside the action space's bounds),
``pairs [P, 2]`` (segment indices), ``labels [P]`` (P(second preferred): 0, 0.5
or 1, or anything in between) and ``mask [P]`` (1 to use the pair, 0 to skip
it). Segments have a fixed length; the steps of one segment may run across an
episode boundary (the policy's log-likelihood is a sum over steps either way).

Shape of the API (shared by every rlx agent): ``Config`` (a ``flax.struct``
dataclass; numeric fields are pytree leaves, ``static`` fields shape the
program), ``validate(config)``, ``make(config, env, env_params, data) ->
Agent(init, update, act, loss)`` and ``train(config, env, env_params, data,
key)``. The environment is only asked for its action and observation spaces,
and by ``evaluate`` (gymnax 1.0 API: ``step`` returns ``obs, state, reward,
terminated, truncated, info`` with auto-reset).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "elu": nn.elu, "gelu": nn.gelu, "swish": nn.swish}
OBJECTIVES = ("cpl", "bc_all", "bc_preferred")
POLICIES = ("deterministic", "tanh_gaussian", "gaussian")  # continuous action spaces; discrete ones: categorical
TANH_CLIP = 1.0 - 1e-3  # dataset actions at the bounds become atanh(+-0.999) ~ +-3.8 before the squashing


def static(default):
    """A dataclass field that is part of the program's structure, not a pytree leaf."""
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class Config:
    """CPL / behaviour-cloning hyper-parameters.

    * ``lr`` (Adam), ``max_grad_norm`` (global-norm clipping), ``weight_decay``
      (decoupled, AdamW).
    * ``alpha`` -- temperature: a segment's score is ``alpha * sum_t gamma**t log pi``.
    * ``gamma`` -- discount of the log-likelihoods inside a segment.
    * ``conservative_bias`` -- CPL's ``lambda`` in (0, 1]: the dispreferred
      segment's score is multiplied by it.
    * ``bc_weight`` -- weight of the preferred segments' negative log-likelihood
      added to the CPL loss (ignored by the BC objectives).
    * ``log_std_min`` / ``log_std_max`` -- range of the state-dependent log std
      (continuous actions).
    * ``objective`` (``cpl``, ``bc_all``, ``bc_preferred``), ``num_updates``
      gradient steps of ``batch_size`` pairs (``bc_all``: ``2 * batch_size``
      segments), ``policy`` for continuous actions (``tanh_gaussian``: a
      Gaussian squashed into the action bounds; ``gaussian``: clipped when
      acting; ``deterministic``: fixed variance, ``log pi = -|u - tanh(mean)|^2``
      with ``u`` the action scaled to [-1, 1], i.e. a squared-error score up to
      a constant), ``normalize_observations`` (with the dataset's mean and std).

    With continuous actions and labels from summed reward, CPL can lower the
    likelihood of the data in states that only appear in dispreferred
    segments by moving the policy far from the data there; on Pendulum the
    ``deterministic`` policy with ``alpha = 1`` suffered least from this (see
    ``rlx/pbrl/offline_study.py``), and behaviour cloning still did better.
    """

    lr: float = 1e-3
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    alpha: float = 0.1
    gamma: float = 1.0
    conservative_bias: float = 0.75
    bc_weight: float = 0.05
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    objective: str = static("cpl")
    num_updates: int = static(2000)
    batch_size: int = static(64)
    hidden_sizes: tuple = static((64, 64))
    activation: str = static("relu")
    policy: str = static("tanh_gaussian")
    normalize_observations: bool = static(True)


def validate(config: Config) -> None:
    """Raise ``ValueError("field=value: rule")`` for the first invalid field.

    Runs in Python on concrete values, before anything is traced.
    """
    rules = [
        ("lr", config.lr > 0, "must be > 0"),
        ("max_grad_norm", config.max_grad_norm > 0, "must be > 0"),
        ("weight_decay", config.weight_decay >= 0, "must be >= 0"),
        ("alpha", config.alpha > 0, "must be > 0"),
        ("gamma", 0 < config.gamma <= 1, "must be in (0, 1]"),
        ("conservative_bias", 0 < config.conservative_bias <= 1, "must be in (0, 1]"),
        ("bc_weight", config.bc_weight >= 0, "must be >= 0"),
        ("log_std_max", config.log_std_min < config.log_std_max, f"must be > log_std_min={config.log_std_min!r}"),
        ("objective", config.objective in OBJECTIVES, f"must be one of {list(OBJECTIVES)}"),
        ("num_updates", config.num_updates >= 1, "must be >= 1"),
        ("batch_size", config.batch_size >= 1, "must be >= 1"),
        ("hidden_sizes", all(isinstance(h, (int, np.integer)) and h >= 1 for h in config.hidden_sizes),
         "every width must be an integer >= 1"),
        ("activation", config.activation in ACTIVATIONS, f"must be one of {sorted(ACTIVATIONS)}"),
        ("policy", config.policy in POLICIES, f"must be one of {list(POLICIES)}"),
    ]
    for field, ok, rule in rules:
        if not ok:
            raise ValueError(f"{field}={getattr(config, field)!r}: {rule}")


# --------------------------------------------------------------------------- data


class Data(NamedTuple):
    """An offline preference dataset (see the module docstring for shapes and meaning)."""

    obs: Any
    actions: Any
    pairs: Any
    labels: Any
    mask: Any


def check_data(data: Data, continuous: bool, obs_shape: tuple, action_dim: int) -> None:
    """Raise ``ValueError`` naming the field whose shape does not fit (and ``pairs`` out of range, for numpy arrays)."""
    obs, actions, pairs = np.shape(data.obs), np.shape(data.actions), np.shape(data.pairs)
    if len(obs) < 2 or tuple(obs[2:]) != tuple(obs_shape):
        raise ValueError(f"obs: shape {obs}, expected [segments, length, *{tuple(obs_shape)}]")
    expected = obs[:2] + ((action_dim,) if continuous else ())
    if tuple(actions) != tuple(expected):
        raise ValueError(f"actions: shape {actions}, expected {expected}")
    if len(pairs) != 2 or pairs[1] != 2 or pairs[0] < 1:
        raise ValueError(f"pairs: shape {pairs}, expected [pairs >= 1, 2]")
    for field in ("labels", "mask"):
        if np.shape(getattr(data, field)) != pairs[:1]:
            raise ValueError(f"{field}: shape {np.shape(getattr(data, field))}, expected ({pairs[0]},)")
    if isinstance(data.pairs, (np.ndarray, list)):
        p = np.asarray(data.pairs)
        if p.min() < 0 or p.max() >= obs[0]:
            raise ValueError(f"pairs: segment indices must be in [0, {obs[0]}), found [{p.min()}, {p.max()}]")


# --------------------------------------------------------------------------- networks and distributions


class MLP(nn.Module):
    """MLP on flattened observations with a linear head of ``out_dim`` units."""

    hidden_sizes: tuple
    activation: str
    out_dim: int
    obs_rank: int = 1

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        x = x.astype(jnp.float32)
        x = x.reshape(x.shape[: x.ndim - self.obs_rank] + (-1,))
        for width in self.hidden_sizes:
            x = act(nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))(x))
        return nn.Dense(self.out_dim, kernel_init=nn.initializers.orthogonal(0.01))(x)


class ActionSpec(NamedTuple):
    action_dim: int
    continuous: bool
    low: Any  # [action_dim] or None
    high: Any


def action_spec(env, env_params) -> ActionSpec:
    """The action space of a gymnax environment: discrete (``n``) or a box."""
    space = env.action_space(env_params)
    if hasattr(space, "n"):
        return ActionSpec(int(space.n), False, None, None)
    low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape).reshape(-1)
    high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape).reshape(-1)
    return ActionSpec(int(np.prod(space.shape)), True, low, high)


class Policy(NamedTuple):
    """What acting needs: network parameters and the observation statistics of the dataset."""

    params: Any
    obs_mean: jax.Array
    obs_std: jax.Array


def policy_functions(config: Config, spec: ActionSpec, obs_shape: tuple):
    """``(network, log_prob(policy, obs, actions), act(policy, obs, key, greedy))`` for one action space."""
    out_dim = spec.action_dim * (2 if spec.continuous else 1)
    network = MLP(tuple(config.hidden_sizes), config.activation, out_dim, len(obs_shape))
    if spec.continuous:
        low, high = jnp.asarray(spec.low), jnp.asarray(spec.high)
        mid, half = (high + low) / 2.0, (high - low) / 2.0

    def heads(policy: Policy, obs):
        x = obs.astype(jnp.float32)
        if config.normalize_observations:
            x = (x - policy.obs_mean) / policy.obs_std
        out = network.apply(policy.params, x)
        if not spec.continuous:
            return out, None
        mean, raw_log_std = jnp.split(out, 2, axis=-1)
        # squash the log std smoothly into [log_std_min, log_std_max]
        log_std = config.log_std_min + 0.5 * (config.log_std_max - config.log_std_min) * (jnp.tanh(raw_log_std) + 1)
        return mean, log_std

    def gaussian_log_prob(x, mean, log_std):
        z = (x - mean) * jnp.exp(-log_std)
        return (-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)

    def log_prob(policy: Policy, obs, actions):
        """log pi(a|s) for a batch: ``obs [..., *obs_shape]``, ``actions [...]`` or ``[..., action_dim]``."""
        out, log_std = heads(policy, obs)
        if not spec.continuous:
            log_p = jax.nn.log_softmax(out)
            return jnp.take_along_axis(log_p, actions[..., None].astype(jnp.int32), -1)[..., 0]
        actions = actions.astype(jnp.float32)
        if config.policy == "gaussian":
            return gaussian_log_prob(actions, out, log_std)
        if config.policy == "deterministic":  # fixed variance: a squared error in [-1, 1] action units
            return -((jnp.clip((actions - mid) / half, -1.0, 1.0) - jnp.tanh(out)) ** 2).sum(-1)
        u = jnp.clip((actions - mid) / half, -TANH_CLIP, TANH_CLIP)
        x = jnp.arctanh(u)
        # change of variables a = mid + half * tanh(x): divide by |da/dx| = half * (1 - tanh(x)^2)
        return gaussian_log_prob(x, out, log_std) - (jnp.log(half) + jnp.log1p(-(u**2))).sum(-1)

    def act(policy: Policy, obs, key, greedy: bool = False):
        """Action for one observation (or a batch): the mode if ``greedy``, else a sample."""
        out, log_std = heads(policy, obs)
        if not spec.continuous:
            return jnp.argmax(out, -1) if greedy else jax.random.categorical(key, out)
        if config.policy == "deterministic":
            noise = 0.0 if greedy else jax.random.normal(key, out.shape) / np.sqrt(2.0)
            return mid + half * jnp.clip(jnp.tanh(out) + noise, -1.0, 1.0)
        x = out if greedy else out + jnp.exp(log_std) * jax.random.normal(key, out.shape)
        if config.policy == "gaussian":
            return jnp.clip(x, low, high)
        return mid + half * jnp.tanh(x)

    return network, log_prob, act


# --------------------------------------------------------------------------- losses


def segment_scores(config: Config, log_probs):
    """CPL's score ``alpha * sum_t gamma**t log pi(a_t|s_t)`` over the last axis of ``log_probs``."""
    length = log_probs.shape[-1]
    discounts = config.gamma ** jnp.arange(length, dtype=jnp.float32)
    return config.alpha * (log_probs * discounts).sum(-1)


def preferred_weights(labels, mask):
    """``[P, 2]`` weights of each segment as 'preferred': the winner 1, a tie both 1; masked pairs 0."""
    first = (labels <= 0.5).astype(jnp.float32)
    second = (labels >= 0.5).astype(jnp.float32)
    return jnp.stack([first, second], -1) * mask[..., None]


def weighted_nll(log_probs, weights):
    """Mean over steps, weighted mean over segments of ``-log pi`` (``log_probs [B, 2, L]``, ``weights [B, 2]``)."""
    per_segment = -log_probs.mean(-1)
    return (per_segment * weights).sum() / jnp.maximum(weights.sum(), 1e-8)


def loss_terms(config: Config, log_probs, labels, mask):
    """The objective for one minibatch: ``log_probs [B, 2, L]`` of both segments' actions, ``labels [B]``, ``mask [B]``.

    Returns ``(loss, metrics)``. ``bc_all`` uses every segment in ``log_probs``
    (labels and mask ignored); ``bc_preferred`` the preferred one of each
    unmasked pair (both for ties); ``cpl`` the biased contrastive loss plus
    ``bc_weight`` times ``bc_preferred``'s loss.
    """
    labels = labels.astype(jnp.float32)
    mask = mask.astype(jnp.float32)
    preferred = preferred_weights(labels, mask)
    nll_all = -log_probs.mean()
    metrics = {"nll": nll_all}
    if config.objective == "bc_all":
        return nll_all, metrics
    bc = weighted_nll(log_probs, preferred)
    metrics["nll_preferred"] = bc
    if config.objective == "bc_preferred":
        return bc, metrics
    scores = segment_scores(config, log_probs)  # [B, 2]
    s0, s1 = scores[..., 0], scores[..., 1]
    lam = config.conservative_bias
    per_pair = labels * jax.nn.softplus(lam * s0 - s1) + (1.0 - labels) * jax.nn.softplus(lam * s1 - s0)
    cpl = (per_pair * mask).sum() / jnp.maximum(mask.sum(), 1.0)
    decided = mask * (labels != 0.5)
    correct = ((s1 > s0) == (labels > 0.5)).astype(jnp.float32)
    metrics.update(
        cpl_loss=cpl,
        accuracy=(correct * decided).sum() / jnp.maximum(decided.sum(), 1.0),
        score_gap=(jnp.abs(s1 - s0) * decided).sum() / jnp.maximum(decided.sum(), 1.0),
    )
    return cpl + config.bc_weight * bc, metrics


# --------------------------------------------------------------------------- training state


class TrainState(struct.PyTreeNode):
    params: Any
    opt_state: Any
    obs_mean: jax.Array
    obs_std: jax.Array
    key: jax.Array
    step: jax.Array

    @property
    def policy(self) -> Policy:
        return Policy(self.params, self.obs_mean, self.obs_std)


class Agent(NamedTuple):
    init: Callable  # key -> TrainState
    update: Callable  # TrainState -> (TrainState, metrics): one gradient step on one minibatch
    act: Callable  # (Policy, obs, key, greedy) -> action
    loss: Callable  # (params, Policy, segments [B, 2], labels [B], mask [B]) -> (loss, metrics)
    log_prob: Callable  # (Policy, obs, actions) -> log pi(a|s)


def make(config: Config, env, env_params, data: Data | None = None) -> Agent:
    """Build the agent's pure functions for one environment's spaces and one dataset.

    ``data`` may hold concrete arrays or tracers (``train`` passes it as an
    argument of its jitted program, so one compiled program serves every dataset
    of the same shapes); without it only ``act`` and ``log_prob`` work.
    """
    spec = action_spec(env, env_params)
    obs_shape = tuple(env.observation_space(env_params).shape)
    if data is not None:
        check_data(data, spec.continuous, obs_shape, spec.action_dim)
    network, log_prob, act = policy_functions(config, spec, obs_shape)
    optimizer = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(config.lr, weight_decay=config.weight_decay),
    )

    def init(key) -> TrainState:
        net_key, key = jax.random.split(key)
        params = network.init(net_key, jnp.zeros(obs_shape))
        if data is not None and config.normalize_observations:
            obs = jnp.asarray(data.obs, jnp.float32)
            obs_mean, obs_std = obs.mean((0, 1)), obs.std((0, 1)) + 1e-3
        else:
            obs_mean, obs_std = jnp.zeros(obs_shape), jnp.ones(obs_shape)
        return TrainState(params, optimizer.init(params), obs_mean, obs_std, key, jnp.asarray(0, jnp.int32))

    def minibatch(key):
        """Segment indices ``[B, 2]`` with the labels and mask of their pairs (fixed shapes, sampled with replacement)."""
        num_segments, num_pairs = data.obs.shape[0], data.pairs.shape[0]
        if config.objective == "bc_all":
            segments = jax.random.randint(key, (config.batch_size, 2), 0, num_segments)
            ones = jnp.ones(config.batch_size)
            return segments, ones, ones
        index = jax.random.randint(key, (config.batch_size,), 0, num_pairs)
        return data.pairs[index].astype(jnp.int32), data.labels[index], data.mask[index]

    def loss(params, stats: Policy, segments, labels, mask):
        obs, actions = data.obs[segments], data.actions[segments]  # [B, 2, L, ...]
        log_probs = log_prob(Policy(params, stats.obs_mean, stats.obs_std), obs, actions)
        return loss_terms(config, log_probs, labels, mask)

    grad_fn = jax.value_and_grad(loss, has_aux=True)

    def update(state: TrainState):
        if data is None:
            raise ValueError("data: make(config, env, env_params, data) needs a dataset to train")
        key, batch_key = jax.random.split(state.key)
        segments, labels, mask = minibatch(batch_key)
        (value, metrics), grads = grad_fn(state.params, state.policy, segments, labels, mask)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": value, "grad_norm": optax.tree.norm(grads), **metrics}
        return state.replace(params=params, opt_state=opt_state, key=key, step=state.step + 1), metrics

    return Agent(init, update, act, loss, log_prob)


def train(config: Config, env, env_params, data: Data, key, num_updates: int | None = None):
    """Train from scratch: ``init`` then ``num_updates`` (default ``config.num_updates``) updates under ``lax.scan``.

    ``key`` is one PRNG key, or a batch ``[n, 2]`` of keys: then ``n`` seeds train
    in one vmapped program (states and metrics get a leading seed axis). The
    dataset is an argument of the compiled program, not a constant in it, so
    datasets of the same shapes reuse one compilation (same ``config`` and ``env``
    object).
    """
    spec = action_spec(env, env_params)
    check_data(data, spec.continuous, tuple(env.observation_space(env_params).shape), spec.action_dim)
    data = Data(*(jnp.asarray(x) for x in data))
    key = jnp.asarray(key)
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    batched = key.ndim == (1 if typed else 2)
    return _train(config, env, env_params, data, key, num_updates or config.num_updates, batched)


@functools.partial(jax.jit, static_argnames=("config", "env", "num_updates", "batched"))
def _train(config, env, env_params, data, key, num_updates, batched):
    def run(key):
        agent = make(config, env, env_params, data)
        state = agent.init(key)
        return jax.lax.scan(lambda s, _: agent.update(s), state, None, num_updates)

    return jax.vmap(run)(key) if batched else run(key)


# --------------------------------------------------------------------------- evaluation


@functools.partial(jax.jit, static_argnames=("config", "env", "episodes", "num_steps", "greedy"))
def _evaluate(config, env, env_params, policy, key, episodes, num_steps, greedy):
    _, _, act = policy_functions(config, action_spec(env, env_params), tuple(env.observation_space(env_params).shape))
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, episodes), env_params)

    def step(carry, _):
        obs, state, returns, running, key = carry
        key, act_key, step_key = jax.random.split(key, 3)
        action = act(policy, obs, act_key, greedy)
        obs, state, reward, terminated, truncated, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, episodes), state, action, env_params
        )
        returns = returns + reward * running
        running = running * (1.0 - jnp.logical_or(terminated, truncated))
        return (obs, state, returns, running, key), None

    carry = (obs, state, jnp.zeros(episodes), jnp.ones(episodes), key)
    (_, _, returns, _, _), _ = jax.lax.scan(step, carry, None, num_steps)
    return returns


def evaluate(config: Config, env, env_params, policy: Policy, key, episodes: int = 16, greedy: bool = True,
             per_episode: bool = False):
    """Mean undiscounted true return of ``episodes`` parallel episodes (greedy actions by default).

    Each episode runs until its first termination or truncation (the
    environment's ``max_steps_in_episode``). ``per_episode=True`` returns the
    ``[episodes]`` returns instead of their mean. Jitted; works under ``vmap``
    over ``policy`` and ``key`` (e.g. a batch of seeds from ``train``).
    """
    num_steps = int(env_params.max_steps_in_episode)
    returns = _evaluate(config, env, env_params, policy, key, episodes, num_steps, greedy)
    return returns if per_episode else returns.mean(-1)


# --------------------------------------------------------------------------- command-line demo


def cartpole_dataset(env, env_params, key, noise_levels=(0.0, 0.25, 0.5, 0.75, 1.0), num_envs=8, num_steps=200,
                     segment_length=20, num_pairs=2000, terminal_penalty=10.0):
    """A small offline CartPole preference dataset: ``(Data, segment_returns)``.

    A scripted controller (push towards the side the pole is falling to) is
    followed, but at each noise level every action is the *opposite* one with
    probability ``noise``; levels from 0 to 1 make a data set in which the good
    and the bad action are about equally common, so cloning all of it is poor
    while the labels tell them apart. The rollouts are cut into segments of
    ``segment_length`` steps, random pairs of distinct segments are drawn and an
    oracle labels each pair by the segments' summed reward minus
    ``terminal_penalty`` per fall (CartPole pays 1 per step whatever happens, so
    without the penalty every segment would tie).
    """

    def rollout(noise, key):
        reset_key, key = jax.random.split(key)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs), env_params)

        def step(carry, key):
            obs, state = carry
            explore_key, step_key = jax.random.split(key)
            scripted = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(jnp.int32)
            action = jnp.where(jax.random.uniform(explore_key, (num_envs,)) < noise, 1 - scripted, scripted)
            next_obs, state, reward, terminated, _, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, num_envs), state, action, env_params
            )
            return (next_obs, state), (obs, action, reward - terminal_penalty * terminated)

        _, traj = jax.lax.scan(step, (obs, state), jax.random.split(key, num_steps))
        cut = num_steps // segment_length

        def segments(x):  # [T, N, ...] -> [N * T / L, L, ...]
            x = jnp.moveaxis(x[: cut * segment_length], 1, 0)
            return x.reshape((num_envs * cut, segment_length) + x.shape[2:])

        return jax.tree.map(segments, traj)

    @jax.jit
    def build(key):
        roll_key, pair_key = jax.random.split(key)
        keys = jax.random.split(roll_key, len(noise_levels))
        obs, actions, rewards = jax.vmap(rollout)(jnp.asarray(noise_levels, jnp.float32), keys)
        obs, actions, rewards = (x.reshape((-1,) + x.shape[2:]) for x in (obs, actions, rewards))
        num_segments = obs.shape[0]
        first = jax.random.randint(pair_key, (num_pairs,), 0, num_segments)
        offset = jax.random.randint(jax.random.fold_in(pair_key, 1), (num_pairs,), 1, num_segments)
        pairs = jnp.stack([first, (first + offset) % num_segments], -1)  # two different segments
        returns = rewards.sum(-1)
        r0, r1 = returns[pairs[:, 0]], returns[pairs[:, 1]]
        labels = jnp.where(r1 > r0, 1.0, jnp.where(r1 < r0, 0.0, 0.5))
        return Data(obs, actions, pairs, labels, jnp.ones(num_pairs)), returns

    return build(key)


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

    parser = argparse.ArgumentParser(description="Offline CPL on a CartPole preference dataset (oracle labels).")
    parser.add_argument("--timesteps", type=int, default=2000, help="gradient steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--objective", default="cpl", choices=OBJECTIVES)
    args = parser.parse_args()
    env = CartPole()
    params = env.default_params
    config = Config(objective=args.objective, num_updates=args.timesteps)
    validate(config)
    start = time.perf_counter()
    key = jax.random.PRNGKey(args.seed)
    data_key, train_key, eval_key = jax.random.split(key, 3)
    data, returns = cartpole_dataset(env, params, data_key)
    decided = float((np.asarray(data.labels) != 0.5).mean())
    print(f"dataset: {data.obs.shape[0]} segments of {data.obs.shape[1]} steps, {data.pairs.shape[0]} pairs "
          f"({decided:.0%} decided), segment return {float(returns.min()):.0f}..{float(returns.max()):.0f}")
    state, metrics = train(config, env, params, data, train_key)
    metrics = jax.tree.map(np.asarray, metrics)
    step = max(1, config.num_updates // 5)
    for i in range(step - 1, config.num_updates, step):
        extra = f"  pair accuracy {metrics['accuracy'][i]:.2f}" if "accuracy" in metrics else ""
        print(f"update {i + 1:6d}  loss {metrics['loss'][i]:8.4f}  nll {metrics['nll'][i]:6.3f}{extra}")
    final = float(evaluate(config, env, params, state.policy, eval_key, episodes=16))
    print(f"final train return {final:.1f} (greedy, 16 episodes) in {time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    _cli()
