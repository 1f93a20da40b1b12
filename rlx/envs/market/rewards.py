"""The seven reward functions of the order-book environment, as pure functions of one step's ledger.

Notation for one agent step: ``q0``, ``q1`` inventory before and after; ``m0``, ``m1`` mid price
before and after (ticks); ``spread`` = the fills' edge over the mid at the start of the step,
``sum(bid qty * (m0 - bid price)) + sum(ask qty * (ask price - m0))``; ``fees`` = fees paid
(negative for rebates); ``realized`` = PnL realized by fills that reduced the position, against its
average entry price, net of this step's fees; ``dW`` = change of marked-to-market wealth
``realized + q * (mid - entry) - fees``. All amounts in ticks x units; ``reward_scale`` divides them.

1. ``positional``: ``q0 * (m1 - m0)``, the inventory's mark-to-market change.
2. ``positional_fills``: ``dW``: the positional PnL plus what fills earned against the mid, minus fees.
3. ``realized``: ``realized``.
4. ``differential_sharpe``: Moody and Saffell's differential Sharpe ratio of ``R = dW``, with
   exponential moments ``A <- A + eta (R - A)``, ``B <- B + eta (R^2 - B)``:
   ``D = (B dA - A dB / 2) / (B - A^2)^(3/2)`` with ``dA = R - A``, ``dB = R^2 - B`` (previous A, B),
   0 until the variance ``B - A^2`` is positive.
5. ``asymmetrical``: ``spread - fees + min(p, 0) + (1 - dampening) * max(p, 0)`` with
   ``p = q0 * (m1 - m0)``: the spread captured plus inventory losses, inventory gains dampened
   (``dampening = 1`` keeps only the losses).
6. ``trade_completion``: +1 when the step realized at least ``completion_multiple`` times the
   taker fee on the notional it closed, -1 when it lost at least that much, else 0.
7. ``inventory_penalty``: ``dW - inventory_penalty * q1^2``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

REWARDS = ("positional", "positional_fills", "realized", "differential_sharpe", "asymmetrical",
           "trade_completion", "inventory_penalty")


@struct.dataclass
class Ledger:
    inventory_before: jax.Array
    inventory_after: jax.Array
    mid_before: jax.Array
    mid_after: jax.Array
    spread: jax.Array
    fees: jax.Array
    realized: jax.Array
    closed_notional: jax.Array
    wealth_change: jax.Array


@struct.dataclass
class RewardSettings:
    reward: int = 1  # index into REWARDS
    reward_scale: float = 1.0
    sharpe_eta: float = 0.01
    dampening: float = 1.0
    completion_multiple: float = 2.0
    inventory_penalty: float = 0.01


def positional(ledger: Ledger, settings: RewardSettings, sharpe, taker_fee) -> jax.Array:
    """``q0 * (m1 - m0)``: the mark-to-market change of the inventory held into the step."""
    return ledger.inventory_before * (ledger.mid_after - ledger.mid_before)


def positional_fills(ledger: Ledger, settings: RewardSettings, sharpe, taker_fee) -> jax.Array:
    """``dW``: positional PnL plus the fills' edge over the mid, minus fees (the change of marked-to-market wealth)."""
    return ledger.wealth_change


def realized(ledger: Ledger, settings: RewardSettings, sharpe, taker_fee) -> jax.Array:
    """``realized``: PnL locked in by fills that reduced the position (against its average entry), net of fees."""
    return ledger.realized


def differential_sharpe_reward(ledger: Ledger, settings: RewardSettings, sharpe, taker_fee) -> jax.Array:
    """``D = (B dA - A dB / 2) / (B - A^2)^(3/2)`` of ``R = dW`` (computed by ``differential_sharpe``)."""
    return sharpe


def asymmetrical(ledger: Ledger, settings: RewardSettings, sharpe, taker_fee) -> jax.Array:
    """``spread - fees + min(p, 0) + (1 - dampening) * max(p, 0)``, ``p`` the positional PnL."""
    p = positional(ledger, settings, sharpe, taker_fee)
    return ledger.spread - ledger.fees + jnp.minimum(p, 0.0) + (1 - settings.dampening) * jnp.maximum(p, 0.0)


def trade_completion(ledger: Ledger, settings: RewardSettings, sharpe, taker_fee) -> jax.Array:
    """+1 if ``realized >= c * taker_fee * closed notional``, -1 if ``<= -`` that, else 0 (0 when nothing closed)."""
    threshold = settings.completion_multiple * taker_fee * ledger.closed_notional
    verdict = jnp.where(ledger.realized >= threshold, 1.0, jnp.where(ledger.realized <= -threshold, -1.0, 0.0))
    return jnp.where(ledger.closed_notional > 0, verdict, 0.0)


def inventory_penalty(ledger: Ledger, settings: RewardSettings, sharpe, taker_fee) -> jax.Array:
    """``dW - inventory_penalty * q1^2``."""
    return ledger.wealth_change - settings.inventory_penalty * ledger.inventory_after**2


# In REWARDS order.
REWARD_FUNCTIONS = (positional, positional_fills, realized, differential_sharpe_reward, asymmetrical, trade_completion,
                    inventory_penalty)
UNSCALED = (REWARDS.index("differential_sharpe"), REWARDS.index("trade_completion"))  # already dimensionless


def differential_sharpe(ret, moments):
    """``(D, new_moments)`` for one return ``ret`` and exponential moments ``moments = (A, B, eta)``."""
    mean, second, eta = moments
    variance = second - mean**2
    d_mean, d_second = ret - mean, ret**2 - second
    sharpe = jnp.where(variance > 1e-12, (second * d_mean - 0.5 * mean * d_second) / jnp.maximum(variance, 1e-12) ** 1.5, 0.0)
    return sharpe, (mean + eta * d_mean, second + eta * d_second)


def reward(ledger: Ledger, moments: jax.Array, settings: RewardSettings, taker_fee) -> tuple[jax.Array, jax.Array]:
    """``(reward, new_moments)``; ``moments`` = ``[A, B]`` of the differential Sharpe ratio (carried in the state);
    ``taker_fee`` (share of notional) sets the trade-completion threshold."""
    sharpe, (mean, second) = differential_sharpe(ledger.wealth_change, (moments[0], moments[1], settings.sharpe_eta))
    branches = [lambda f=f: f(ledger, settings, sharpe, taker_fee) for f in REWARD_FUNCTIONS]
    value = jax.lax.switch(jnp.clip(settings.reward, 0, len(REWARDS) - 1), branches)
    scale = jnp.where(jnp.isin(settings.reward, jnp.asarray(UNSCALED)), 1.0, 1.0 / settings.reward_scale)
    return value * scale, jnp.stack([mean, second])
