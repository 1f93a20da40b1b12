"""Market making on recorded (or synthetic) order-book days, stepped by time or by events.

An episode is one day. At each decision step the agent chooses one of 17 actions:

- ``0``: do nothing (resting orders stay, keeping their queue positions);
- ``1``-``15``: quote one bid and one ask of ``order_size`` at book levels chosen from
  {1, 5, 10, 15} (level 1 = best), every pair except (15, 15), the pair closest to doing
  nothing; a quote at the price an order already rests at keeps its place in the queue;
- ``16``: flatten: cancel both quotes and close the position with a market order.

**Broker.** A new limit order joins the back of its price level: the displayed size there is
the queue ahead of it. Aggressive trades at that price first consume the queue ahead, then fill
the order (partially if they run out); a trade at a worse price (through our price) fills
whatever remains. Between steps the queue ahead shrinks to the displayed size if that fell
(cancellations ahead of us). Market orders walk the book level by level (slippage) and pay
``taker_fee`` on their notional; limit fills pay ``maker_fee`` (negative: a rebate). A bid is
only sized up to the room left below ``max_inventory`` (and an ask down to ``-max_inventory``).
At the day's last decision the position is flattened at market.

**Accounting** in ticks x units: an average entry price, realized PnL when fills reduce the
position, fees, and marked-to-market wealth ``realized - fees + q (mid - entry)``. The reward is
one of ``rewards.REWARDS`` (see ``rlx/envs/market/rewards.py``).

**Observation**: the market features of the last ``window`` decision steps
(``features.snapshot_features``, scaled with the previous day's statistics), then the
inventory over ``max_inventory``, the unrealized PnL in bps of the order notional, and the
distances of the agent's resting bid and ask to the mid in bps (0 when none).

The data live in ``BookParams`` (arrays of fixed capacity over days and steps, with each day's
step count), so one compiled program serves any set of days, vmapped over days and episodes.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlx.envs.market import features as feature_lib
from rlx.envs.market.data import BookDay
from rlx.envs.market.rewards import REWARDS, Ledger, RewardSettings, reward
from rlx.envs.registry import import_env_module
from rlx.errors import ConfigError

environment = import_env_module("gymnax.environments.environment")
spaces = import_env_module("gymnax.environments.spaces")

QUOTE_LEVELS = (1, 5, 10, 15)
LEVEL_PAIRS = tuple(pair for pair in itertools.product(QUOTE_LEVELS, QUOTE_LEVELS) if pair != (15, 15))
DO_NOTHING, FLATTEN = 0, len(LEVEL_PAIRS) + 1
NUM_ACTIONS = len(LEVEL_PAIRS) + 2
AGENT_FEATURES = 4


@struct.dataclass
class Order:
    price: jax.Array  # ticks (int32); meaningless when remaining == 0
    remaining: jax.Array
    queue: jax.Array  # displayed size ahead of us at our price


@struct.dataclass
class BookState(environment.EnvState):
    day: jax.Array
    step: jax.Array
    bid: Order
    ask: Order
    inventory: jax.Array
    entry: jax.Array  # average entry price of the open position (ticks)
    realized: jax.Array
    fees: jax.Array
    moments: jax.Array  # differential Sharpe ratio's exponential moments [A, B]
    time: int


@struct.dataclass
class BookParams(environment.EnvParams):
    features: jax.Array = None  # [D, S, F] scaled market features at each decision
    mid: jax.Array = None  # [D, S] ticks
    elapsed: jax.Array = None  # [D, S] seconds from the day's first snapshot to each decision
    bid_prices: jax.Array = None  # [D, S, L] int32 ticks
    bid_sizes: jax.Array = None
    ask_prices: jax.Array = None
    ask_sizes: jax.Array = None
    sell_volume: jax.Array = None  # [D, S, L] aggressive sells at the step's start bid prices
    sell_low: jax.Array = None  # [D, S] lowest sell price in the step (int32 max when none)
    buy_volume: jax.Array = None
    buy_high: jax.Array = None
    num_steps: jax.Array = None  # [D] decisions per day (the episode has num_steps - 1 steps)
    tick_size: float = 0.01
    day: int = -1  # -1: each episode draws a day uniformly; d >= 0: always day d
    order_size: float = 1.0
    max_inventory: float = 10.0
    maker_fee: float = 0.0  # share of notional (negative = rebate)
    taker_fee: float = 0.0005
    rewards: RewardSettings = RewardSettings()
    max_steps_in_episode: int = 1_000_000  # build_params sets the step capacity: days end by termination first


def build_params(days: list[BookDay], stepping: str = "time", interval: float = 10.0, threshold_bps: float = 2.0,
                 levels: int = 15, select=None, **settings) -> BookParams:
    """Stack ``days`` (chronological) into ``BookParams``; ``select`` keeps some days (each still scaled by its predecessor)."""
    if levels < max(QUOTE_LEVELS):
        raise ConfigError(f"env.options.levels: {levels} < {max(QUOTE_LEVELS)}, the deepest level an action quotes")
    select = list(range(len(days))) if select is None else list(select)
    if not select:
        raise ConfigError("no days selected")
    prepared, features_of = [], {}

    def day_features(d):  # each day's features serve its own rows and its successor's scaling: compute once
        if d not in features_of:
            features_of[d] = feature_lib.snapshot_features(days[d], levels)
        return features_of[d]

    for d in select:
        day = days[d]
        indices = feature_lib.decision_indices(day, stepping, interval, threshold_bps)
        if len(indices) < 2:
            raise ConfigError(f"{day.name}: fewer than two decisions with stepping={stepping} (interval {interval} s, "
                              f"threshold {threshold_bps} bps)")
        mean, std = feature_lib.fit_scaling(day_features(d - 1 if d > 0 else d))
        market = (day_features(d)[indices] - mean) / std
        trades = feature_lib.step_trades(day, indices, levels)
        prepared.append((day, indices, market, trades))
    capacity = max(len(p[1]) for p in prepared)

    def stack(rows, dtype, fill=0):
        out = np.full((len(rows), capacity, *np.shape(rows[0])[1:]), fill, dtype)
        for i, row in enumerate(rows):
            out[i, : len(row)] = row
        return jnp.asarray(out)

    pick = lambda name: [getattr(day, name)[indices, :levels] for day, indices, *_ in prepared]  # noqa: E731
    rewards = {k: settings.pop(k) for k in list(settings) if k in RewardSettings.__dataclass_fields__}
    if "reward" in rewards:
        rewards["reward"] = reward_index(rewards["reward"])
    return BookParams(
        features=stack([p[2] for p in prepared], np.float32),
        mid=stack([day.mid()[indices] for day, indices, *_ in prepared], np.float32),
        elapsed=stack([day.timestamps[indices] - day.timestamps[0] for day, indices, *_ in prepared], np.float32),
        bid_prices=stack(pick("bid_prices"), np.int32), bid_sizes=stack(pick("bid_sizes"), np.float32),
        ask_prices=stack(pick("ask_prices"), np.int32), ask_sizes=stack(pick("ask_sizes"), np.float32),
        sell_volume=stack([p[3][0] for p in prepared], np.float32),
        sell_low=stack([p[3][1].clip(None, feature_lib.NO_TRADE_LOW) for p in prepared], np.int32, feature_lib.NO_TRADE_LOW),
        buy_volume=stack([p[3][2] for p in prepared], np.float32),
        buy_high=stack([p[3][3].clip(feature_lib.NO_TRADE_HIGH) for p in prepared], np.int32, feature_lib.NO_TRADE_HIGH),
        num_steps=jnp.asarray([len(p[1]) for p in prepared], jnp.int32),
        tick_size=float(prepared[0][0].tick_size),
        rewards=RewardSettings(**rewards),
        **{"max_steps_in_episode": capacity, **settings},
    )


def reward_index(name) -> int:
    if isinstance(name, str):
        if name not in REWARDS:
            raise ConfigError(f"env.options.reward: unknown reward {name!r}; valid: {', '.join(REWARDS)}")
        return REWARDS.index(name)
    if isinstance(name, bool) or not isinstance(name, (int, np.integer)) or not 0 <= name < len(REWARDS):
        raise ConfigError(f"env.options.reward: {name!r} is neither a reward name nor an index below {len(REWARDS)}; "
                          f"valid: {', '.join(REWARDS)}")
    return int(name)


def walk_book(prices, sizes, quantity):
    """Notional (ticks x units) of a market order of ``quantity`` >= 0 walking levels; beyond the book, one tick worse."""
    before = jnp.cumsum(sizes) - sizes
    taken = jnp.clip(quantity - before, 0.0, sizes)
    beyond = jnp.maximum(quantity - sizes.sum(), 0.0)
    worse = prices[-1] + jnp.sign(prices[-1] - prices[0])
    return jnp.sum(taken * prices) + beyond * worse


def apply_fill(inventory, entry, quantity, price):
    """Signed fill ``quantity`` at ``price``: ``(inventory, entry, realized, closed units)``."""
    same_direction = inventory * quantity >= 0
    closed = jnp.where(same_direction, 0.0, jnp.minimum(jnp.abs(quantity), jnp.abs(inventory)))
    realized = closed * (price - entry) * jnp.sign(inventory)
    new_inventory = inventory + quantity
    grown = (inventory * entry + quantity * price) / jnp.where(new_inventory == 0, 1.0, new_inventory)
    flipped = jnp.abs(quantity) > jnp.abs(inventory)
    new_entry = jnp.where(same_direction, grown, jnp.where(flipped, price, entry))
    return new_inventory, jnp.where(new_inventory == 0, 0.0, new_entry), realized, closed


class BookEnv(environment.Environment):
    """17-action market making on order-book days held in ``BookParams``."""

    def __init__(self, params: BookParams, window: int = 10):
        super().__init__()
        if window < 1:
            raise ConfigError(f"env.options.window: {window} must be >= 1")
        self.window = window
        self._params = params
        self.levels = params.bid_prices.shape[-1]
        self.num_market_features = params.features.shape[-1]

    @property
    def default_params(self) -> BookParams:
        return self._params

    def reset_env(self, key, params: BookParams):
        days = params.num_steps.shape[0]
        day = jnp.where(params.day >= 0, params.day, jax.random.randint(key, (), 0, days))
        none = Order(price=jnp.int32(0), remaining=jnp.float32(0), queue=jnp.float32(0))
        state = BookState(day=day, step=jnp.int32(0), bid=none, ask=none, inventory=jnp.float32(0),
                          entry=jnp.float32(0), realized=jnp.float32(0), fees=jnp.float32(0),
                          moments=jnp.zeros(2, jnp.float32), time=0)
        return self.get_obs(state, params), state

    def wealth(self, state: BookState, mid) -> jax.Array:
        return state.realized - state.fees + state.inventory * (mid - state.entry)

    def step_env(self, key, state: BookState, action, params: BookParams):
        d, s = state.day, state.step
        mid_before, mid_after = params.mid[d, s], params.mid[d, s + 1]
        bid_prices, ask_prices = params.bid_prices[d, s], params.ask_prices[d, s]
        last = s + 2 >= params.num_steps[d]

        bid, ask = self.place_quotes(state, action, params)
        inventory, entry, realized, fees, closed_notional = (state.inventory, state.entry, jnp.float32(0),
                                                             jnp.float32(0), jnp.float32(0))
        # Action 16: close the position at market on the current book.
        flatten = action == FLATTEN
        inventory, entry, realized, fees, closed_notional = self.market_close(
            flatten, inventory, entry, realized, fees, closed_notional, bid_prices, params.bid_sizes[d, s],
            ask_prices, params.ask_sizes[d, s], params)
        # Resting orders meet the trades of (s, s + 1].
        bid_fill, bid = self.match(bid, params.sell_volume[d, s], bid_prices, params.sell_low[d, s] < bid.price,
                                   params.bid_prices[d, s + 1], params.bid_sizes[d, s + 1])
        ask_fill, ask = self.match(ask, params.buy_volume[d, s], ask_prices, params.buy_high[d, s] > ask.price,
                                   params.ask_prices[d, s + 1], params.ask_sizes[d, s + 1])
        spread = bid_fill * (mid_before - bid.price) + ask_fill * (ask.price - mid_before)
        for quantity, price in ((bid_fill, bid.price), (-ask_fill, ask.price)):
            inventory, entry, step_realized, closed = apply_fill(inventory, entry, quantity, price.astype(jnp.float32))
            realized, closed_notional = realized + step_realized, closed_notional + closed * price
            fees = fees + params.maker_fee * jnp.abs(quantity) * price
        # End of day: flatten at the next book.
        closing = last & (inventory != 0)
        inventory, entry, realized, fees, closed_notional = self.market_close(
            last, inventory, entry, realized, fees, closed_notional, params.bid_prices[d, s + 1],
            params.bid_sizes[d, s + 1], params.ask_prices[d, s + 1], params.ask_sizes[d, s + 1], params)
        new_state = state.replace(
            step=s + 1, bid=bid, ask=ask, inventory=inventory, entry=entry, realized=state.realized + realized,
            fees=state.fees + fees, time=state.time + 1)
        wealth_change = self.wealth(new_state, mid_after) - self.wealth(state, mid_before)
        ledger = Ledger(inventory_before=state.inventory, inventory_after=inventory, mid_before=mid_before,
                        mid_after=mid_after, spread=spread, fees=fees, realized=realized - fees,
                        closed_notional=closed_notional, wealth_change=wealth_change)
        step_reward, moments = reward(ledger, state.moments, params.rewards, params.taker_fee)
        new_state = new_state.replace(moments=moments)
        info = {"inventory": inventory, "wealth": self.wealth(new_state, mid_after), "bid_fill": bid_fill,
                "ask_fill": ask_fill, "flatten": flatten.astype(jnp.float32), "day": d, "mid": mid_after,
                "market_orders": (flatten & (state.inventory != 0)).astype(jnp.float32) + closing.astype(jnp.float32)}
        return self.get_obs(new_state, params), new_state, step_reward, last, info

    def place_quotes(self, state: BookState, action, params: BookParams) -> tuple[Order, Order]:
        d, s = state.day, state.step
        pairs = jnp.asarray(LEVEL_PAIRS, jnp.int32) - 1
        quote = (action >= 1) & (action <= len(LEVEL_PAIRS))
        bid_level, ask_level = pairs[jnp.clip(action - 1, 0, len(LEVEL_PAIRS) - 1)]
        bid_room = jnp.clip(params.max_inventory - state.inventory, 0.0, params.order_size)
        ask_room = jnp.clip(params.max_inventory + state.inventory, 0.0, params.order_size)

        def requote(order, prices, sizes, level, room):
            price = prices[level]
            stays = (order.remaining > 0) & (order.price == price)
            fresh = Order(price=price, remaining=room, queue=sizes[level])
            kept = order.replace(remaining=jnp.minimum(order.remaining, room))
            placed = jax.tree.map(lambda a, b: jnp.where(stays, a, b), kept, fresh)
            cancelled = order.replace(remaining=jnp.float32(0))
            out = jax.tree.map(lambda a, b: jnp.where(quote, a, b), placed, order)
            return jax.tree.map(lambda a, b: jnp.where(action == FLATTEN, a, b), cancelled, out)

        bid = requote(state.bid, params.bid_prices[d, s], params.bid_sizes[d, s], bid_level, bid_room)
        ask = requote(state.ask, params.ask_prices[d, s], params.ask_sizes[d, s], ask_level, ask_room)
        return bid, ask

    @staticmethod
    def match(order: Order, volume, start_prices, through, next_prices, next_sizes):
        """Fill of a resting order from the step's trades at its price; its queue and remainder after.

        Cancellations ahead of the order show as a smaller displayed size at its price in the next book, so the
        queue shrinks to that size. A price beyond the displayed levels has no size to read: the queue keeps what
        the trades left of it. Trades are recorded at the start book's levels only, so trades at the exact price of
        an order resting beyond them do not count (a trade through it still fills it)."""
        at_price = jnp.sum(volume * (start_prices == order.price))
        fill = jnp.where(through, order.remaining, jnp.clip(at_price - order.queue, 0.0, order.remaining))
        fill = jnp.where(order.remaining > 0, fill, 0.0)
        displayed = jnp.sum(next_sizes * (next_prices == order.price))
        deepest = next_prices[-1]  # bids fall and asks rise with depth
        beyond = jnp.where(next_prices[0] > deepest, order.price < deepest, order.price > deepest)
        queue = jnp.maximum(order.queue - at_price, 0.0)
        queue = jnp.where(beyond, queue, jnp.minimum(queue, displayed))
        return fill, order.replace(remaining=order.remaining - fill, queue=queue)

    @staticmethod
    def market_close(go, inventory, entry, realized, fees, closed_notional, bid_prices, bid_sizes, ask_prices,
                     ask_sizes, params):
        """If ``go``: close ``inventory`` at market (sell into bids or buy from asks), with taker fees."""
        quantity = jnp.abs(inventory)
        notional = jnp.where(inventory > 0, walk_book(bid_prices.astype(jnp.float32), bid_sizes, quantity),
                             walk_book(ask_prices.astype(jnp.float32), ask_sizes, quantity))
        price = notional / jnp.maximum(quantity, 1e-9)
        new_inventory, new_entry, step_realized, closed = apply_fill(inventory, entry, -inventory, price)
        go = go & (quantity > 0)
        pick = lambda a, b: jnp.where(go, a, b)  # noqa: E731
        return (pick(new_inventory, inventory), pick(new_entry, entry), pick(realized + step_realized, realized),
                pick(fees + params.taker_fee * notional, fees), pick(closed_notional + closed * price, closed_notional))

    def get_obs(self, state: BookState, params: BookParams, key=None) -> jax.Array:
        rows = jnp.clip(state.step - jnp.arange(self.window)[::-1], 0, None)
        market = params.features[state.day, rows].reshape(-1)
        mid = params.mid[state.day, state.step]
        notional = jnp.maximum(params.order_size * mid, 1e-9)
        distance = lambda order: jnp.where(order.remaining > 0, (order.price - mid) / mid * 1e4, 0.0)  # noqa: E731
        agent = jnp.stack([
            state.inventory / params.max_inventory,
            state.inventory * (mid - state.entry) / notional * 1e4,
            distance(state.bid),
            distance(state.ask),
        ])
        return jnp.concatenate([market, agent]).astype(jnp.float32)

    def is_terminated(self, state: BookState, params: BookParams) -> jax.Array:
        return state.step + 1 >= params.num_steps[state.day]

    def action_space(self, params: BookParams | None = None):
        return spaces.Discrete(NUM_ACTIONS)

    def observation_space(self, params: BookParams):
        return spaces.Box(-jnp.inf, jnp.inf, (self.window * self.num_market_features + AGENT_FEATURES,), jnp.float32)


def make_book(data: str = "synthetic", num_days: int = 8, seed: int = 0, data_dir: str | None = None,
              stepping: str = "time", interval: float = 10.0, threshold_bps: float = 2.0, levels: int = 15,
              window: int = 10, reward: str = "positional_fills") -> BookEnv:
    """A ``BookEnv`` over ``num_days`` synthetic days (``data="synthetic"``) or every ``day_*.npz`` in ``data_dir``."""
    from rlx.envs.market import data as data_lib
    from rlx.envs.market import synthetic

    reward_index(reward)
    if data == "synthetic":
        days = synthetic.generate_days(num_days, seed)
    elif data == "npz":
        from pathlib import Path

        if data_dir is None or not Path(data_dir).is_dir():
            raise ConfigError(f"env.options.data_dir: {data_dir!r} is not a directory of day_*.npz files")
        paths = sorted(Path(data_dir).glob("day_*.npz"))
        if not paths:
            raise ConfigError(f"env.options.data_dir: no day_*.npz files in {data_dir}")
        days = [data_lib.load_day(p) for p in paths]
    else:
        raise ConfigError(f"env.options.data: unknown value {data!r}; valid: synthetic, npz")
    return BookEnv(build_params(days, stepping, interval, threshold_bps, levels, reward=reward), window)
