"""Closed-form market makers for ``QuotingEnv``, and a batched simulator to score any quoting policy.

A policy here is a pure function ``policy(state, params) -> [bid depth, ask
depth]`` of the environment state, so the closed forms can read the time and
inventory directly; ``simulate`` runs one over thousands of paths in one jitted
program. The formulas (with ``A`` = ``arrival_rate``, ``k`` = ``fill_decay``,
``tau`` = time left, ``q`` = inventory):

- fixed spread: the same depth on both sides whatever the state;
- Avellaneda-Stoikov (2008): reservation price ``s - q gamma sigma^2 tau`` and
  total spread ``gamma sigma^2 tau + (2 / gamma) ln(1 + gamma / k)``;
- Gueant-Lehalle-Fernandez-Tapia (2013), the asymptotic (long-horizon) quotes:
  ``delta_b = c1 + (2q + 1)/2 * c2``, ``delta_a = c1 - (2q - 1)/2 * c2`` with
  ``c1 = ln(1 + gamma / k) / gamma`` and
  ``c2 = sqrt(sigma^2 gamma / (2 k A) * (1 + gamma / k)^(1 + k / gamma))``;
- Cartea-Jaimungal (Cartea, Jaimungal and Penalva 2015, ch. 10): the optimum
  for the penalised objective ``E[X_T + q_T S_T - alpha q_T^2 - phi int q^2 dt]``
  with inventory in ``[-Q, Q]``. The value is ``x + q s + h(t, q)`` with
  ``h = ln(omega) / k`` and ``omega(t) = expm(M (T - t)) z``, where ``M`` is
  tridiagonal (``-phi k q^2`` on the diagonal, ``A e^-1`` beside it) and
  ``z_q = exp(-alpha k q^2)``; the optimal depths are
  ``delta_b = 1/k - (h(t, q+1) - h(t, q))`` and ``delta_a = 1/k - (h(t, q-1) - h(t, q))``.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from rlx.errors import ConfigError
from rlx.envs.market.quoting import QuotingEnv, QuotingParams, QuotingState

Policy = Callable[[QuotingState, QuotingParams], jax.Array]


def time_left(state: QuotingState, params: QuotingParams) -> jax.Array:
    return params.horizon * (1.0 - state.time / params.max_steps_in_episode)


def fixed_spread(depth: float) -> Policy:
    """Quote ``depth`` on both sides, always."""

    def policy(state, params):
        return jnp.full(2, depth, jnp.float32)

    return policy


def avellaneda_stoikov_depths(gamma, sigma, k, tau, inventory):
    """``(bid depth, ask depth)``: reservation-price skew ``q gamma sigma^2 tau`` around the AS half spread."""
    inventory_risk = gamma * sigma**2 * tau
    half_spread = 0.5 * inventory_risk + jnp.log1p(gamma / k) / gamma
    skew = inventory * inventory_risk
    return half_spread + skew, half_spread - skew


def gueant_lehalle_tapia_depths(gamma, sigma, k, arrival_rate, inventory):
    """``(bid depth, ask depth)`` of the GLFT asymptotic quotes (time-independent)."""
    base = jnp.log1p(gamma / k) / gamma
    slope = jnp.sqrt(sigma**2 * gamma / (2 * k * arrival_rate) * (1 + gamma / k) ** (1 + k / gamma))
    return base + (2 * inventory + 1) / 2 * slope, base - (2 * inventory - 1) / 2 * slope


def avellaneda_stoikov(gamma: float) -> Policy:
    """Quotes around the reservation price with the Avellaneda-Stoikov spread, risk aversion ``gamma``."""

    def policy(state, params):
        return jnp.stack(avellaneda_stoikov_depths(gamma, params.sigma, params.fill_decay, time_left(state, params),
                                                   state.inventory))

    return policy


def gueant_lehalle_tapia(gamma: float) -> Policy:
    """The Gueant-Lehalle-Fernandez-Tapia asymptotic quotes (time-independent), risk aversion ``gamma``."""

    def policy(state, params):
        return jnp.stack(gueant_lehalle_tapia_depths(gamma, params.sigma, params.fill_decay, params.arrival_rate,
                                                     state.inventory))

    return policy


def cartea_jaimungal_h(params: QuotingParams) -> np.ndarray:
    """``h(t_n, q)`` on the environment's step grid: ``[steps + 1, 2Q + 1]`` (float64, q from -Q to Q)."""
    limit = int(params.max_inventory)
    inventories = np.arange(-limit, limit + 1, dtype=np.float64)
    k = float(params.fill_decay)
    generator = np.diag(-float(params.inventory_penalty) * k * inventories**2)
    neighbour = float(params.arrival_rate) * np.exp(-1.0)
    generator += np.diag(np.full(2 * limit, neighbour), 1) + np.diag(np.full(2 * limit, neighbour), -1)
    terminal = np.exp(-float(params.terminal_penalty) * k * inventories**2)
    steps = int(params.max_steps_in_episode)
    times_left = float(params.horizon) * (1.0 - np.arange(steps + 1) / steps)
    # omega = expm(G tau) terminal overflows for long horizons; shifting G by its largest eigenvalue keeps it
    # bounded (G - top I commutes with G), and the shift comes back as top * tau in log omega.
    top = float(np.linalg.eigvalsh(generator)[-1])
    shifted = np.eye(len(inventories)) * top
    omega = np.stack([scipy.linalg.expm((generator - shifted) * tau) @ terminal for tau in times_left])
    if not np.all(omega > 0):
        smallest = int(np.abs(inventories[(omega <= 0).any(axis=0)]).min())
        raise ConfigError(
            f"env.params.max_inventory: {limit} is too large for the Cartea-Jaimungal table with these penalties "
            f"(exp(-penalty * q^2) underflows from |q| = {smallest}); use max_inventory <= {smallest - 1}"
        )
    return (np.log(omega) + top * times_left[:, None]) / k


def cartea_jaimungal_value(params: QuotingParams) -> float:
    """The optimum's expected penalised PnL from ``t = 0`` with no inventory (continuous time)."""
    h = cartea_jaimungal_h(params)
    return float(h[0, h.shape[1] // 2])


def cartea_jaimungal_depths(params: QuotingParams) -> np.ndarray:
    """Optimal ``[steps + 1, 2Q + 1, 2]`` (bid, ask) depths; at the inventory limit the blocked side reads 1/k."""
    h = cartea_jaimungal_h(params)
    k = float(params.fill_decay)
    bid = np.full_like(h, 1.0 / k)
    ask = np.full_like(h, 1.0 / k)
    bid[:, :-1] = 1.0 / k - (h[:, 1:] - h[:, :-1])
    ask[:, 1:] = 1.0 / k - (h[:, :-1] - h[:, 1:])
    return np.stack([bid, ask], axis=-1)


def cartea_jaimungal(params: QuotingParams) -> Policy:
    """The finite-inventory optimum for these parameters, tabulated once on the host."""
    table = jnp.asarray(cartea_jaimungal_depths(params), jnp.float32)
    limit = int(params.max_inventory)

    def policy(state, params):
        row = jnp.clip(state.inventory.astype(jnp.int32) + limit, 0, 2 * limit)
        return table[state.time, row]

    return policy


def simulate(env: QuotingEnv, params: QuotingParams, policy: Policy, key, num_paths: int) -> dict[str, jax.Array]:
    """Run ``policy`` over ``num_paths`` independent episodes; per-path totals.

    Returns ``return`` (summed rewards), ``pnl`` (final marked-to-market
    wealth), ``terminal_inventory``, ``mean_spread`` (bid plus ask depth,
    averaged over the episode's steps) and ``fills``. ``policy`` maps the
    state to depths, so a learned policy enters as
    ``lambda state, params: act(env.get_obs(state, params))``.
    """
    steps = int(params.max_steps_in_episode)

    def one_path(path_key):
        reset_key, steps_key = jax.random.split(path_key)
        _, state = env.reset_env(reset_key, params)

        def step(state, step_key):
            depths = policy(state, params)
            action = depths if env.actions == "continuous" else nearest_grid_action(env, params, depths)
            _, state, reward, _, info = env.step_env(step_key, state, action, params)
            return state, (reward, info["spread"], info["bid_fill"] + info["ask_fill"])

        state, (rewards, spreads, fills) = jax.lax.scan(step, state, jax.random.split(steps_key, steps))
        return {
            "return": rewards.sum(),
            "pnl": state.cash + state.inventory * state.mid,
            "terminal_inventory": state.inventory,
            "mean_spread": spreads.mean(),
            "fills": fills.sum(),
        }

    return jax.jit(jax.vmap(one_path))(jax.random.split(key, num_paths))


def nearest_grid_action(env: QuotingEnv, params: QuotingParams, depths) -> jax.Array:
    """The discrete action whose depth pair is nearest ``depths`` (for closed forms on the discrete grid)."""
    grid = jnp.linspace(0.0, params.max_depth, env.depth_levels)
    bid, ask = (jnp.argmin(jnp.abs(grid - d)) for d in depths)
    return bid * env.depth_levels + ask
