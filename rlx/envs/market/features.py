"""Host-side preparation of order-book days: decision steps, trades per step, and market features.

Everything here runs once per dataset in NumPy; the environment then only gathers rows.

- **Stepping.** ``time``: a decision every ``interval`` seconds (the first snapshot at or after
  each multiple). ``event``: a decision whenever the mid has moved by at least ``threshold_bps``
  basis points since the previous decision.
- **Trades per step.** For the step from decision ``s`` to ``s + 1``: the volume sold by aggressors
  at each of the start book's bid prices, the lowest price any sell traded at (``NO_TRADE_LOW``
  when none), and the same for buys against the asks (``NO_TRADE_HIGH``).
- **Features per snapshot** (``6L + 4`` columns, L levels): per-level distances of bid and ask
  prices to the mid (bps); per-level log notional (``log1p(price * size)``) of bids and asks;
  per-level order-flow imbalance (Cont, Kukanov and Stoikov's e_n, bid contribution minus ask,
  between consecutive snapshots); per-level notional imbalance ``(bid - ask) / (bid + ask)``;
  trade-flow imbalance ``(buy - sell) / (buy + sell)`` volume over the last ``windows`` snapshots;
  RSI of mid changes over the same two windows (scaled to [-1, 1]).
- **Scaling**: ``fit_scaling`` gives the mean and standard deviation of a day's features; the
  environment scales each day with the previous day's statistics (the first day its own).
"""

from __future__ import annotations

import numpy as np

from rlx.envs.market.data import BookDay
from rlx.errors import ConfigError

STEPPINGS = ("time", "event")
NO_TRADE_LOW = np.iinfo(np.int32).max
NO_TRADE_HIGH = np.iinfo(np.int32).min


def decision_indices(day: BookDay, stepping: str, interval: float, threshold_bps: float) -> np.ndarray:
    if stepping not in STEPPINGS:
        raise ConfigError(f"env.options.stepping: unknown value {stepping!r}; valid: {', '.join(STEPPINGS)}")
    if stepping == "time":
        if not interval > 0:
            raise ConfigError(f"env.options.interval: {interval} must be > 0 (seconds between decisions)")
        marks = np.arange(day.timestamps[0], day.timestamps[-1], interval)
        return np.unique(np.searchsorted(day.timestamps, marks))
    if not threshold_bps > 0:
        raise ConfigError(f"env.options.threshold_bps: {threshold_bps} must be > 0 (mid move that makes an event)")
    mid = day.mid()
    indices, anchor = [0], mid[0]
    for i in range(1, len(mid)):
        if abs(mid[i] - anchor) / anchor * 1e4 >= threshold_bps:
            indices.append(i)
            anchor = mid[i]
    return np.asarray(indices)


def step_trades(day: BookDay, indices: np.ndarray, levels: int):
    """``(sell_volume [S-1, L], sell_low [S-1], buy_volume [S-1, L], buy_high [S-1])`` for decision steps."""
    steps = len(indices) - 1
    edges = day.timestamps[indices]
    step_of = np.searchsorted(edges, day.trade_times, side="left") - 1  # trade in (edges[s], edges[s+1]]
    inside = (step_of >= 0) & (step_of < steps)
    sell_volume, buy_volume = np.zeros((steps, levels)), np.zeros((steps, levels))
    sell_low = np.full(steps, NO_TRADE_LOW, np.int64)
    buy_high = np.full(steps, NO_TRADE_HIGH, np.int64)
    for side, volume, book in ((-1, sell_volume, day.bid_prices), (1, buy_volume, day.ask_prices)):
        pick = inside & (day.trade_sides == side)
        s, price, size = step_of[pick], day.trade_prices[pick], day.trade_sizes[pick]
        start_book = book[indices[s], :levels]
        match = start_book == price[:, None]
        rows, cols = np.nonzero(match)
        np.add.at(volume, (s[rows], cols), size[rows])
        if side < 0:
            np.minimum.at(sell_low, s, price)
        else:
            np.maximum.at(buy_high, s, price)
    return sell_volume, sell_low, buy_volume, buy_high


def snapshot_features(day: BookDay, levels: int, windows=(10, 60)) -> np.ndarray:
    if day.levels < levels:
        raise ConfigError(f"env.options.levels: {levels} is beyond the book depth of {day.name} ({day.levels} levels)")
    bid_p, ask_p = day.bid_prices[:, :levels].astype(np.float64), day.ask_prices[:, :levels].astype(np.float64)
    bid_q, ask_q = day.bid_sizes[:, :levels], day.ask_sizes[:, :levels]
    mid = day.mid()[:, None]
    distance = np.concatenate([(bid_p - mid) / mid, (ask_p - mid) / mid], axis=1) * 1e4
    bid_notional, ask_notional = bid_p * day.tick_size * bid_q, ask_p * day.tick_size * ask_q
    notional = np.log1p(np.concatenate([bid_notional, ask_notional], axis=1))
    imbalance = (bid_notional - ask_notional) / np.maximum(bid_notional + ask_notional, 1e-12)
    ofi = order_flow_imbalance(bid_p, bid_q, ask_p, ask_q)
    flows = [trade_flow_imbalance(day, w) for w in windows]
    rsis = [rsi(day.mid(), w) for w in windows]
    return np.concatenate([distance, notional, ofi, imbalance, np.stack(flows + rsis, axis=1)], axis=1)


def order_flow_imbalance(bid_p, bid_q, ask_p, ask_q) -> np.ndarray:
    """Per-level e_n between consecutive snapshots (0 for the first)."""
    e = np.zeros_like(bid_q)
    bp0, bp1, bq0, bq1 = bid_p[:-1], bid_p[1:], bid_q[:-1], bid_q[1:]
    ap0, ap1, aq0, aq1 = ask_p[:-1], ask_p[1:], ask_q[:-1], ask_q[1:]
    e[1:] = (bp1 >= bp0) * bq1 - (bp1 <= bp0) * bq0 - (ap1 <= ap0) * aq1 + (ap1 >= ap0) * aq0
    return e


def trade_flow_imbalance(day: BookDay, window: int) -> np.ndarray:
    """``(buy - sell) / (buy + sell)`` aggressor volume over the last ``window`` snapshot intervals."""
    interval = np.clip(np.searchsorted(day.timestamps, day.trade_times, side="left"), 0, len(day.timestamps) - 1)
    buy = np.bincount(interval, day.trade_sizes * (day.trade_sides > 0), len(day.timestamps))
    sell = np.bincount(interval, day.trade_sizes * (day.trade_sides < 0), len(day.timestamps))
    buy, sell = rolling_sum(buy, window), rolling_sum(sell, window)
    return (buy - sell) / np.maximum(buy + sell, 1e-12)


def rsi(mid: np.ndarray, window: int) -> np.ndarray:
    """Relative strength of mid changes over ``window`` snapshots, as ``(up - down) / (up + down)`` in [-1, 1]."""
    change = np.diff(mid, prepend=mid[0])
    up, down = rolling_sum(np.maximum(change, 0), window), rolling_sum(np.maximum(-change, 0), window)
    return (up - down) / np.maximum(up + down, 1e-12)


def rolling_sum(values: np.ndarray, window: int) -> np.ndarray:
    total = np.cumsum(values)
    shifted = np.concatenate([np.zeros(window), total[:-window]]) if window < len(total) else np.zeros_like(total)
    return total - shifted[: len(total)]


def fit_scaling(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return features.mean(axis=0), np.maximum(features.std(axis=0), 1e-6)
