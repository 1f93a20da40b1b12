"""A seeded synthetic limit-order book in JAX, in the spirit of Cont, Stoikov and Talreja (2010).

Each second, on each side of a book whose levels sit on consecutive ticks:

1. Resting sizes relax toward their stationary profile: limit orders arrive at rate
   ``limit_rate`` per level, a share ``cancel_rate`` of the resting size is cancelled, plus
   Gaussian noise of the arrivals' size (a diffusion approximation of the queue's birth and
   death process).
2. Market orders arrive (Poisson, ``market_rate`` per side, exponential sizes of mean
   ``market_size``) and walk the opposite side from its best level: every level they empty
   moves the best price one tick; the traded volume per price is recorded as trades.
3. When the spread exceeds one tick, a new level appears inside it with probability
   ``improve_prob`` per side (liquidity providers stepping in).

A day's **regime** scales that order flow: ``calm``; ``trending`` (market orders on one side,
drawn per day, arrive ``trend_bias`` times as often as on the other); ``volatile`` (market
orders ``volatile_flow`` times as frequent and resting sizes ``volatile_depth`` times as thin).
``generate_days`` draws a regime per day and returns ``BookDay`` objects (``rlx.envs.market.data``);
``write_days`` stores them as ``day_XXX.npz`` plus ``manifest.json`` (seed, regimes, settings).
Same seed, same days, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlx.envs.market.data import BookDay, save_day

REGIMES = ("calm", "trending", "volatile")


@dataclasses.dataclass(frozen=True)
class SyntheticMarket:
    levels: int = 20
    seconds: int = 7200  # snapshots per day, one per second
    start_price: float = 1000.0
    tick_size: float = 0.1  # 1 tick = 1 basis point at the start price
    limit_rate: float = 1.0  # lots per level and second
    cancel_rate: float = 0.1  # share of resting size cancelled per second (stationary size 10 lots)
    market_rate: float = 0.25  # market orders per side and second
    market_size: float = 3.0  # mean lots per market order
    improve_prob: float = 0.5
    trend_bias: float = 1.3
    volatile_flow: float = 2.0
    volatile_depth: float = 0.5


def _side_second(key, best, sizes, volume, market: SyntheticMarket, depth_scale, direction):
    """One side's second: relax sizes, then consume ``volume``. Returns (best, sizes, traded per level)."""
    levels = sizes.shape[0]
    noise_key, fresh_key = jax.random.split(key)
    stationary = depth_scale * market.limit_rate / market.cancel_rate
    arrivals = depth_scale * market.limit_rate
    sizes = sizes + arrivals - market.cancel_rate * sizes + jnp.sqrt(arrivals) * jax.random.normal(noise_key, (levels,))
    sizes = jnp.maximum(sizes, 0.0)
    before = jnp.cumsum(sizes) - sizes
    traded = jnp.clip(volume - before, 0.0, sizes)
    remaining = sizes - traded
    emptied = jnp.sum(jnp.cumsum(remaining) <= 1e-9)  # leading levels with nothing left
    fresh = stationary * jax.random.uniform(fresh_key, (levels,), minval=0.5, maxval=1.5)
    index = jnp.arange(levels) + emptied
    sizes = jnp.where(index < levels, remaining[jnp.minimum(index, levels - 1)], fresh)
    return best - direction * emptied, sizes, traded


def _improve(key, best, other_best, sizes, market, depth_scale, direction):
    """With ``improve_prob``, a new best level one tick inside a spread wider than one tick."""
    gap = direction * (other_best - best) > 1
    go = gap & (jax.random.uniform(key) < market.improve_prob)
    size = depth_scale * market.limit_rate / market.cancel_rate * 0.5
    shifted = jnp.concatenate([jnp.array([size]), sizes[:-1]])
    return jnp.where(go, best + direction, best), jnp.where(go, shifted, sizes)


def _improve_both(key, best_bid, best_ask, bid_sizes, ask_sizes, market, depth):
    """Both sides may step into the spread; which side tries first is a coin flip (no drift either way)."""
    order_key, bid_key, ask_key = jax.random.split(key, 3)
    bid_first_bid = _improve(bid_key, best_bid, best_ask, bid_sizes, market, depth, 1)
    bid_first_ask = _improve(ask_key, best_ask, bid_first_bid[0], ask_sizes, market, depth, -1)
    ask_first_ask = _improve(ask_key, best_ask, best_bid, ask_sizes, market, depth, -1)
    ask_first_bid = _improve(bid_key, best_bid, ask_first_ask[0], bid_sizes, market, depth, 1)
    bid_first = jax.random.bernoulli(order_key)
    pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(bid_first, x, y), a, b)  # noqa: E731
    (best_bid, bid_sizes), (best_ask, ask_sizes) = pick((bid_first_bid, bid_first_ask), (ask_first_bid, ask_first_ask))
    return best_bid, best_ask, bid_sizes, ask_sizes


def simulate_day(key, market: SyntheticMarket, regime: int, trend_sign: float):
    """Arrays of one day: best bid/ask ticks ``[T]``, sizes ``[T, L]`` and traded volume per level ``[T, L]``."""
    flow = jnp.where(regime == 2, market.volatile_flow, 1.0)
    depth = jnp.where(regime == 2, market.volatile_depth, 1.0)
    bias = jnp.where(regime == 1, market.trend_bias, 1.0)
    buy_rate = market.market_rate * flow * jnp.where(trend_sign > 0, bias, 1.0)
    sell_rate = market.market_rate * flow * jnp.where(trend_sign > 0, 1.0, bias)
    start = jnp.round(market.start_price / market.tick_size)
    stationary = depth * market.limit_rate / market.cancel_rate
    init = (start - 1, start + 1, jnp.full(market.levels, stationary), jnp.full(market.levels, stationary))

    def volume(key, rate):
        count_key, size_key = jax.random.split(key)
        count = jax.random.poisson(count_key, rate)
        return jnp.where(count > 0, jax.random.gamma(size_key, jnp.maximum(count, 1)) * market.market_size, 0.0)

    def second(carry, key):
        best_bid, best_ask, bid_sizes, ask_sizes = carry
        keys = jax.random.split(key, 5)
        sells, buys = volume(keys[0], sell_rate), volume(keys[1], buy_rate)
        bid_before, ask_before = best_bid, best_ask
        best_bid, bid_sizes, sold = _side_second(keys[2], best_bid, bid_sizes, sells, market, depth, 1)
        best_ask, ask_sizes, bought = _side_second(keys[3], best_ask, ask_sizes, buys, market, depth, -1)
        best_bid, best_ask, bid_sizes, ask_sizes = _improve_both(keys[4], best_bid, best_ask, bid_sizes, ask_sizes,
                                                                 market, depth)
        snapshot = (best_bid, best_ask, bid_sizes, ask_sizes, bid_before, ask_before, sold, bought)
        return (best_bid, best_ask, bid_sizes, ask_sizes), snapshot

    _, out = jax.lax.scan(second, init, jax.random.split(key, market.seconds))
    return out


def to_book_day(arrays, market: SyntheticMarket, name: str) -> BookDay:
    best_bid, best_ask, bid_sizes, ask_sizes, bid_before, ask_before, sold, bought = (np.asarray(a) for a in arrays)
    levels = np.arange(market.levels)
    seconds = np.arange(1, market.seconds + 1, dtype=np.float64)
    trade_times, trade_prices, trade_sizes, trade_sides = [], [], [], []
    for side, before, traded, direction in ((-1, bid_before, sold, -1), (1, ask_before, bought, 1)):
        rows, cols = np.nonzero(traded > 1e-9)
        trade_times.append(seconds[rows] - 0.5 + 1e-3 * cols)
        trade_prices.append((before[rows] + direction * cols).astype(np.int64))
        trade_sizes.append(traded[rows, cols])
        trade_sides.append(np.full(len(rows), side))
    order = np.argsort(np.concatenate(trade_times), kind="stable")
    return BookDay(
        timestamps=seconds,
        bid_prices=(best_bid[:, None] - levels).astype(np.int64), bid_sizes=bid_sizes.astype(np.float64),
        ask_prices=(best_ask[:, None] + levels).astype(np.int64), ask_sizes=ask_sizes.astype(np.float64),
        trade_times=np.concatenate(trade_times)[order], trade_prices=np.concatenate(trade_prices)[order],
        trade_sizes=np.concatenate(trade_sizes)[order].astype(np.float64),
        trade_sides=np.concatenate(trade_sides)[order].astype(np.int64),
        tick_size=market.tick_size, name=name,
    )


def draw_regimes(num_days: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Regime index and trend sign per day (NumPy, from ``seed``)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, len(REGIMES), num_days), rng.choice([-1.0, 1.0], num_days)


def generate_days(num_days: int, seed: int = 0, market: SyntheticMarket = SyntheticMarket()) -> list[BookDay]:
    """``num_days`` synthetic days, regimes drawn from ``seed``; deterministic."""
    regimes, signs = draw_regimes(num_days, seed)
    keys = jax.random.split(jax.random.PRNGKey(seed), num_days)
    simulate = jax.jit(jax.vmap(simulate_day, in_axes=(0, None, 0, 0)), static_argnums=1)
    out = simulate(keys, market, jnp.asarray(regimes), jnp.asarray(signs))
    return [to_book_day([a[d] for a in out], market, f"synthetic_{seed}_{d:03d}_{REGIMES[regimes[d]]}")
            for d in range(num_days)]


def write_days(directory, num_days: int, seed: int = 0, market: SyntheticMarket = SyntheticMarket()) -> list[Path]:
    """Generate and store ``day_XXX.npz`` files plus ``manifest.json`` in ``directory``."""
    directory = Path(directory)
    days = generate_days(num_days, seed, market)
    paths = [save_day(day, directory / f"day_{d:03d}.npz") for d, day in enumerate(days)]
    regimes, _ = draw_regimes(num_days, seed)
    manifest = {"seed": seed, "days": [p.name for p in paths], "regimes": [REGIMES[r] for r in regimes],
                "market": dataclasses.asdict(market)}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return paths
