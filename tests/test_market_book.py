"""The order-book market-making environment: stepping, features, the seven rewards, the broker."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.envs import registry
from rlx.envs.market import book, features, rewards, synthetic
from rlx.envs.market.data import BookDay
from rlx.errors import ConfigError

LEVELS = 15


def flat_day(steps: int, mids=None, trades=(), best_bid=1000, size=5.0) -> BookDay:
    """A hand-built day: 1-s snapshots, contiguous levels, ``size`` everywhere; ``mids`` shift the book (ticks)."""
    shift = np.zeros(steps, np.int64) if mids is None else np.asarray(mids, np.int64)
    bids = best_bid + shift[:, None] - np.arange(LEVELS)
    asks = best_bid + 1 + shift[:, None] + np.arange(LEVELS)
    times, prices, sizes, sides = (np.array(v, dtype) for v, dtype in
                                   zip(zip(*trades) if trades else ([], [], [], []), (float, np.int64, float, np.int64)))
    return BookDay(timestamps=np.arange(1.0, steps + 1), bid_prices=bids, bid_sizes=np.full((steps, LEVELS), size),
                   ask_prices=asks, ask_sizes=np.full((steps, LEVELS), size), trade_times=times, trade_prices=prices,
                   trade_sizes=sizes, trade_sides=sides, tick_size=0.01, name="hand")


def test_time_and_event_stepping_indices():
    day = flat_day(30, mids=[0] * 5 + [1] * 5 + [3] * 5 + [2] * 5 + [6] * 10)
    np.testing.assert_array_equal(features.decision_indices(day, "time", 10.0, 1.0), [0, 10, 20])
    # mid in ticks ~1000.5; 2 ticks ~ 20 bps: events at moves of >= 19 bps from the last event's mid.
    np.testing.assert_array_equal(features.decision_indices(day, "event", 1.0, 19.0), [0, 10, 20])
    np.testing.assert_array_equal(features.decision_indices(day, "event", 1.0, 9.0), [0, 5, 10, 15, 20])  # 1 tick ~ 10 bps
    with pytest.raises(ConfigError, match="threshold_bps"):
        features.decision_indices(day, "event", 1.0, 0.0)
    with pytest.raises(ConfigError, match="valid: time, event"):
        features.decision_indices(day, "tick", 1.0, 1.0)
    # Event decisions are unevenly spaced in time: the closed forms read the time left from the decisions' clocks.
    uneven = flat_day(30, mids=[0] * 3 + [1] * 12 + [3] * 15)
    params = book.build_params([uneven], "event", 1.0, 9.0, LEVELS)
    np.testing.assert_array_equal(params.elapsed[0, : int(params.num_steps[0])], [0.0, 3.0, 15.0])


def test_trades_are_assigned_to_steps_and_levels():
    trades = [(1.5, 1000, 2.0, -1), (2.5, 999, 1.0, -1), (2.6, 1000, 4.0, -1), (3.5, 1003, 3.0, 1)]
    day = flat_day(4, trades=trades)
    sell_volume, sell_low, buy_volume, buy_high = features.step_trades(day, np.arange(4), LEVELS)
    np.testing.assert_allclose(sell_volume[:, :2], [[2, 0], [4, 1], [0, 0]])
    np.testing.assert_array_equal(sell_low, [1000, 999, features.NO_TRADE_LOW])
    np.testing.assert_allclose(buy_volume[2, :3], [0, 0, 3])  # asks 1001, 1002, 1003
    np.testing.assert_array_equal(buy_high, [features.NO_TRADE_HIGH, features.NO_TRADE_HIGH, 1003])


def test_order_flow_imbalance_by_hand():
    bid_p, ask_p = np.array([[10.0], [11.0], [11.0]]), np.array([[12.0], [12.0], [13.0]])
    bid_q, ask_q = np.array([[2.0], [3.0], [1.0]]), np.array([[4.0], [5.0], [6.0]])
    # t=1: bid up (+3), ask same (-5 + 4); t=2: bid same (1 - 3), ask up (+5)
    np.testing.assert_allclose(features.order_flow_imbalance(bid_p, bid_q, ask_p, ask_q)[:, 0], [0, 2, 3])


def test_rsi_and_rolling_sums_by_hand():
    np.testing.assert_allclose(features.rolling_sum(np.array([1.0, 2, 3, 4]), 2), [1, 3, 5, 7])
    np.testing.assert_allclose(features.rsi(np.array([0.0, 1, 3, 2, 2]), 3), [0, 1, 1, 0.5, 1 / 3])  # last window: +2, -1, 0


LEDGER = dict(inventory_before=2.0, inventory_after=1.0, mid_before=100.0, mid_after=101.5, spread=0.5, fees=0.1,
              realized=0.9, closed_notional=102.0, wealth_change=3.4)


@pytest.mark.parametrize("name, expected", [
    ("positional", 3.0),
    ("positional_fills", 3.4),
    ("realized", 0.9),
    ("asymmetrical", 0.5 - 0.1 + 0.0 + 0.0),  # gains fully dampened (dampening 1)
    ("trade_completion", 1.0),  # 0.9 >= 2 * 0.0005 * 102
    ("inventory_penalty", 3.4 - 0.01 * 1.0),
])
def test_each_reward_on_a_hand_built_step(name, expected):
    settings = rewards.RewardSettings(reward=rewards.REWARDS.index(name))
    value, _ = rewards.reward(rewards.Ledger(**LEDGER), jnp.zeros(2), settings, 0.0005)
    assert float(value) == pytest.approx(expected, rel=1e-5)


def test_asymmetrical_keeps_losses_and_trade_completion_is_symmetric():
    losing = {**LEDGER, "mid_after": 99.0, "realized": -0.5}
    settings = rewards.RewardSettings(reward=rewards.REWARDS.index("asymmetrical"), dampening=0.5)
    value, _ = rewards.reward(rewards.Ledger(**losing), jnp.zeros(2), settings, 0.0005)
    assert float(value) == pytest.approx(0.5 - 0.1 - 2.0)
    settings = rewards.RewardSettings(reward=rewards.REWARDS.index("trade_completion"))
    value, _ = rewards.reward(rewards.Ledger(**losing), jnp.zeros(2), settings, 0.0005)
    assert float(value) == -1.0
    small = {**LEDGER, "realized": 0.05}
    assert float(rewards.reward(rewards.Ledger(**small), jnp.zeros(2), settings, 0.0005)[0]) == 0.0


def test_differential_sharpe_matches_a_numpy_loop():
    returns = np.random.default_rng(0).normal(0.1, 1.0, 50)
    eta, a, b, expected = 0.1, 0.0, 0.0, []
    for r in returns:
        variance = b - a * a
        expected.append((b * (r - a) - 0.5 * a * (r * r - b)) / variance**1.5 if variance > 1e-12 else 0.0)
        a, b = a + eta * (r - a), b + eta * (r * r - b)
    settings = rewards.RewardSettings(reward=rewards.REWARDS.index("differential_sharpe"), sharpe_eta=eta)
    moments, got = jnp.zeros(2), []
    for r in returns:
        value, moments = rewards.reward(rewards.Ledger(**{**LEDGER, "wealth_change": jnp.float32(r)}), moments, settings, 0.0005)
        got.append(float(value))
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)


def test_average_entry_and_realized_pnl_by_hand():
    q, entry, realized, closed = book.apply_fill(0.0, 0.0, 1.0, 100.0)
    q, entry, realized, closed = book.apply_fill(q, entry, 1.0, 102.0)
    assert (float(q), float(entry), float(realized)) == (2.0, 101.0, 0.0)
    q, entry, realized, closed = book.apply_fill(q, entry, -3.0, 105.0)
    assert (float(q), float(entry), float(realized), float(closed)) == (-1.0, 105.0, 8.0, 2.0)


def test_walk_book_slippage_by_hand():
    prices, sizes = jnp.array([100.0, 99.0, 98.0]), jnp.array([1.0, 2.0, 1.0])
    assert float(book.walk_book(prices, sizes, 2.5)) == pytest.approx(100 + 99 * 1.5)
    assert float(book.walk_book(prices, sizes, 5.0)) == pytest.approx(100 + 198 + 98 + 97)  # beyond: one tick worse


def one_day_env(day, **settings):
    params = book.build_params([day], "time", 1.0, 1.0, LEVELS, **settings)
    return book.BookEnv(params, window=2), params


def run_actions(env, params, actions):
    _, state = env.reset(jax.random.PRNGKey(0), params)
    out = []
    for action in actions:
        _, state, reward, terminated, _, info = env.step(jax.random.PRNGKey(1), state, jnp.int32(action), params)
        out.append((state, float(reward), bool(terminated), info))
    return out


def action_for(bid_level, ask_level):
    return book.LEVEL_PAIRS.index((bid_level, ask_level)) + 1


def test_queue_ahead_is_consumed_before_our_order_fills():
    """Bid at level 1 behind 5 lots: 3 traded (no fill), then 2.5 more (0.5 of our 1 lot), then the rest."""
    trades = [(1.5, 1000, 3.0, -1), (2.5, 1000, 2.5, -1), (3.5, 1000, 4.0, -1)]
    env, params = one_day_env(flat_day(6, trades=trades), maker_fee=0.0)
    keep = book.DO_NOTHING
    out = run_actions(env, params, [action_for(1, 15), keep, keep])
    assert [float(o[3]["bid_fill"]) for o in out] == pytest.approx([0.0, 0.5, 0.5])
    assert float(out[0][0].bid.queue) == pytest.approx(2.0)
    assert float(out[2][0].inventory) == pytest.approx(1.0)


def test_cancellations_ahead_shrink_the_queue_and_trade_through_fills_all():
    day = flat_day(6, trades=[(2.5, 1000, 1.0, -1)])
    day.bid_sizes[1:, 0] = 1.0  # the level shrinks from 5 to 1 lot after the first step: we move up
    env, params = one_day_env(day, maker_fee=0.0)
    out = run_actions(env, params, [action_for(1, 15), book.DO_NOTHING])
    assert float(out[0][0].bid.queue) == pytest.approx(1.0)
    assert float(out[1][3]["bid_fill"]) == 0.0  # exactly the queue ahead traded
    through = flat_day(6, trades=[(1.5, 999, 0.1, -1)])
    env, params = one_day_env(through, maker_fee=0.0)
    assert float(run_actions(env, params, [action_for(1, 15)])[0][3]["bid_fill"]) == 1.0


def test_an_order_beyond_the_displayed_levels_keeps_its_queue():
    """A bid at level 15 behind 5 lots; the book moves up a tick, so the level is out of view for a step, then back.
    No size is shown there meanwhile, which must not read as an empty queue: 3 lots trading at its price later
    leave 2 of the 5 ahead, and nothing fills."""
    deepest = 1000 - (LEVELS - 1)
    day = flat_day(8, mids=[0, 0, 1, 0, 0, 0, 0, 0], trades=[(4.5, deepest, 3.0, -1)])
    env, params = one_day_env(day, maker_fee=0.0)
    keep = book.DO_NOTHING
    out = run_actions(env, params, [action_for(15, 1), keep, keep, keep])
    assert int(out[0][0].bid.price) == deepest
    assert [float(o[0].bid.queue) for o in out] == pytest.approx([5.0, 5.0, 5.0, 2.0])
    assert [float(o[3]["bid_fill"]) for o in out] == [0.0, 0.0, 0.0, 0.0]
    # Asks mirror it: the book moves down a tick, the ask at level 15 is out of view, and its queue stays.
    day = flat_day(6, mids=[0, 0, -1, 0, 0, 0])
    env, params = one_day_env(day, maker_fee=0.0)
    out = run_actions(env, params, [action_for(1, 15), keep, keep])
    assert [float(o[0].ask.queue) for o in out] == pytest.approx([5.0, 5.0, 5.0])


def test_requoting_the_same_price_keeps_the_queue_position():
    env, params = one_day_env(flat_day(6, trades=[(1.5, 1000, 3.0, -1)]))
    out = run_actions(env, params, [action_for(1, 15), action_for(1, 5)])
    assert float(out[1][0].bid.queue) == pytest.approx(2.0)  # not back to 5
    out = run_actions(env, params, [action_for(1, 15), action_for(5, 5)])
    assert float(out[1][0].bid.queue) == pytest.approx(5.0) and int(out[1][0].bid.price) == 996


def test_flatten_closes_at_market_with_taker_fee_and_day_end_flattens():
    trades = [(1.5, 1000, 6.0, -1)]  # fills our bid (1 lot behind 5)
    env, params = one_day_env(flat_day(5, trades=trades), maker_fee=0.0, taker_fee=0.001)
    out = run_actions(env, params, [action_for(1, 15), book.FLATTEN])
    state = out[1][0]
    assert float(state.inventory) == 0.0
    assert float(state.fees) == pytest.approx(0.001 * 1000)  # sold 1 lot at the best bid, 1000 ticks
    assert float(state.realized) == pytest.approx(0.0)  # bought at 1000, sold at 1000
    assert int(params.num_steps[0]) == 4  # decisions at 1, 2, 3, 4 s: three steps
    out = run_actions(env, params, [action_for(1, 15), book.DO_NOTHING, book.DO_NOTHING])
    assert float(out[1][0].inventory) == 1.0 and not out[1][2]
    assert out[2][2] and float(out[2][3]["inventory"]) == 0.0  # flattened at the day's end
    assert [float(o[3]["market_orders"]) for o in out] == [0.0, 0.0, 1.0]  # the day-end close is one
    out = run_actions(env, params, [action_for(1, 15), book.FLATTEN, book.FLATTEN])
    assert [float(o[3]["market_orders"]) for o in out] == [0.0, 1.0, 0.0]  # flattening nothing sends nothing


def test_random_play_conserves_wealth_and_respects_the_inventory_limit():
    """The environment's wealth (realized PnL, fees, entry-price mark) equals an independent cash ledger: cash
    paid and received at our orders' prices and at the market closes' notionals, less fees, plus inventory at
    the mid, at every step of random play with flattening, rebates and the day-end close."""
    days = synthetic.generate_days(2, seed=1, market=synthetic.SyntheticMarket(levels=16, seconds=900))
    params = book.build_params(days, "time", 5.0, 1.0, LEVELS, max_inventory=3.0, reward="positional_fills",
                               maker_fee=-0.0002)
    day = params.replace(day=0)
    env = book.BookEnv(params, window=3)
    steps = int(params.num_steps[0]) - 1

    def close_notional(inventory, s):
        bids = book.walk_book(day.bid_prices[0, s].astype(jnp.float32), day.bid_sizes[0, s], jnp.abs(inventory))
        asks = book.walk_book(day.ask_prices[0, s].astype(jnp.float32), day.ask_sizes[0, s], jnp.abs(inventory))
        return jnp.where(inventory > 0, bids, asks)

    def episode(key):
        _, state = env.reset(key, day)

        def step(carry, k):
            state, cash = carry
            action = jax.random.randint(k, (), 0, book.NUM_ACTIONS)
            _, new, r, term, info = env.step_env(k, state, action, day)
            flatten = action == book.FLATTEN
            closed = jnp.where(flatten, close_notional(state.inventory, state.step), 0.0)
            cash = cash + jnp.sign(state.inventory) * closed - params.taker_fee * closed
            bought, sold = info["bid_fill"] * new.bid.price, info["ask_fill"] * new.ask.price
            cash = cash - bought + sold - params.maker_fee * (bought + sold)
            held = jnp.where(flatten, 0.0, state.inventory) + info["bid_fill"] - info["ask_fill"]
            closed = jnp.where(term, close_notional(held, state.step + 1), 0.0)
            cash = cash + jnp.sign(held) * closed - params.taker_fee * closed
            return (new, cash), (r, term, info["inventory"], info["wealth"], cash + info["inventory"] * info["mid"])

        return jax.lax.scan(step, (state, jnp.float32(0)), jax.random.split(key, steps))[1]

    r, term, inventory, wealth, ledger = jax.jit(jax.vmap(episode))(jax.random.split(jax.random.PRNGKey(0), 8))
    assert bool(term[:, -1].all()) and not bool(term[:, :-1].any())
    assert float(jnp.abs(inventory).max()) <= 3.0 and float(jnp.abs(inventory).max()) > 0
    np.testing.assert_allclose(inventory[:, -1], 0.0)
    np.testing.assert_allclose(wealth, ledger, atol=0.05)
    np.testing.assert_allclose(r.sum(1), wealth[:, -1], rtol=1e-3, atol=0.5)


def test_event_stepping_changes_the_number_of_decisions_and_vmaps_over_days():
    days = synthetic.generate_days(2, seed=2, market=synthetic.SyntheticMarket(levels=16, seconds=900))
    timed = book.build_params(days, "time", 10.0, 1.0, LEVELS)
    evented = book.build_params(days, "event", 10.0, 3.0, LEVELS)
    assert list(np.asarray(timed.num_steps)) == [90, 90]
    assert not np.array_equal(np.asarray(evented.num_steps), [90, 90])
    env = book.BookEnv(evented, window=4)
    keys = jax.random.split(jax.random.PRNGKey(0), 16)
    obs, states = jax.vmap(env.reset, in_axes=(0, None))(keys, evented)
    assert obs.shape == (16, 4 * (6 * LEVELS + 4) + 4) and set(np.asarray(states.day)) == {0, 1}
    obs, states, *_ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, states, jnp.arange(16) % 17, evented)
    assert np.isfinite(np.asarray(obs)).all()


def test_bad_options_give_clear_errors():
    with pytest.raises(ConfigError, match="unknown reward 'pnl'; valid: positional, positional_fills"):
        registry.make("market_book", {"reward": "pnl", "num_days": 1})
    for index in (9, -1, 2.5, True):  # lax.switch would clamp an index to the nearest reward
        with pytest.raises(ConfigError, match=f"reward: {index!r} is neither a reward name nor an index below 7"):
            registry.make("market_book", {"reward": index, "num_days": 1})
    day = flat_day(30)
    with pytest.raises(ConfigError, match="levels: 10 < 15"):
        book.build_params([day], levels=10)
    with pytest.raises(ConfigError, match="beyond the book depth"):
        book.build_params([day], levels=20)
    with pytest.raises(ConfigError, match="interval"):
        book.build_params([day], "time", interval=0.0)


@pytest.mark.slow  # ~18 s; the environment's own tests stay in the fast suite
def test_book_preset_trains_through_the_cli(run_cli, tmp_path):
    import json

    done = run_cli("+exp=ppo_market_book", "logger=none", "algo.total_timesteps=4096", "run.num_seeds=1",
                   "env.options.num_days=2", "env.options.stepping=event", "env.options.threshold_bps=3",
                   "env.options.reward=differential_sharpe", "run.eval_episodes=2")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert np.isfinite(summary["final_eval"]["return_mean"])


def test_study_summary_figures_by_hand():
    from rlx.envs.market import event_study

    per_day = {"pnl": np.array([2.0, -1.0, 3.0, -2.0]), "map": np.array([1.0, 1.0, 2.0, 0.0]),
               "fills": np.array([4, 2, 3, 1]), "decisions": np.array([10, 10, 10, 10])}
    out = event_study.summary(per_day)
    assert out["daily_pnl"] == pytest.approx(0.5)
    assert out["sharpe"] == pytest.approx(0.5 / np.std([2.0, -1.0, 3.0, -2.0]))
    assert out["sortino"] == pytest.approx(0.5 / np.sqrt((1 + 4) / 4))
    assert out["max_drawdown"] == pytest.approx(4.0 - 2.0)  # equity 2, 1, 4, 2
    assert out["pnl_to_map"] == pytest.approx(2.0 / 1.0) and out["fill_rate"] == pytest.approx(0.25)


def test_study_welch_interval_matches_scipy():
    from scipy import stats

    from rlx.envs.market import event_study

    a, b = np.array([3.0, 4.0, 5.5, 4.2, 3.9]), np.array([1.0, 2.5, 0.5, 2.0, 1.1])
    diff, half = event_study.welch(a, b)
    interval = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert diff - half == pytest.approx(interval.low) and diff + half == pytest.approx(interval.high)


def sweeping_day(seconds: int, order_chance: float, keep_going: float, seed: int = 0) -> BookDay:
    """A still book (bid 100, ask 101) hit on each side each second with chance ``order_chance`` by one market
    order that sweeps one more level with chance ``keep_going`` each time, leaving one trade record per level."""
    rng = np.random.default_rng(seed)
    levels = 12
    times, prices, sides = [], [], []
    for second in range(seconds):
        for side, best, direction in ((-1, 100, -1), (1, 101, 1)):
            if rng.random() < order_chance:
                reach = min(rng.geometric(1 - keep_going) - 1, levels - 1)  # levels beyond the best: P(>= j) = keep_going^j
                for level in range(reach + 1):
                    times.append(second + 0.5 + 1e-3 * level)
                    prices.append(best + direction * level)
                    sides.append(side)
    order = np.argsort(times, kind="stable")
    snapshots = seconds + 1
    ladder = np.arange(levels)
    return BookDay(
        timestamps=np.arange(snapshots, dtype=np.float64),
        bid_prices=np.tile(100 - ladder, (snapshots, 1)), bid_sizes=np.full((snapshots, levels), 5.0),
        ask_prices=np.tile(101 + ladder, (snapshots, 1)), ask_sizes=np.full((snapshots, levels), 5.0),
        trade_times=np.asarray(times)[order], trade_prices=np.asarray(prices)[order],
        trade_sizes=np.ones(len(times)), trade_sides=np.asarray(sides)[order], tick_size=0.01, name="sweeps",
    )


def test_study_calibration_recovers_the_per_side_order_intensity():
    """Orders reaching depth 0.5 + j ticks arrive at ``order_chance * keep_going ** j`` per side and second, so
    k = -ln(keep_going) and A = order_chance * exp(k / 2); counting every level's record (one per level swept) or
    both sides together would inflate A."""
    from rlx.envs.market import event_study

    order_chance, keep_going = 0.6, 0.5
    fit = event_study.calibrate([sweeping_day(20_000, order_chance, keep_going)])
    k = -np.log(keep_going)
    assert fit["k"] == pytest.approx(k, rel=0.05)
    assert fit["A"] == pytest.approx(order_chance * np.exp(k / 2), rel=0.05)
    assert fit["sigma"] == 0.0  # the mid never moves


def test_study_calibration_without_trades_says_so():
    from rlx.envs.market import data, event_study

    with pytest.raises(data.DataError, match="sweeps: too few trades"):
        event_study.calibrate([sweeping_day(100, order_chance=0.0, keep_going=0.5)])


def test_holm_correction_and_the_comparisons_note_by_hand():
    """The 14 pairs of mm_event_vs_time (2026-12-08): six per-pair 95% verdicts, one after Holm's correction."""
    from rlx.envs.market.event_study import comparisons_note, holm_count

    p_values = [0.0026, 0.0182, 0.0242, 0.0251, 0.0374, 0.0457, 0.0769, 0.2148, 0.2195, 0.2454, 0.2801, 0.3378,
                0.5139, 0.911]
    assert holm_count(p_values) == 1  # 0.0026 <= 0.05 / 14; 0.0182 > 0.05 / 13
    assert holm_count([0.01, 0.02, 0.03]) == 3  # 0.01 <= 0.05/3, 0.02 <= 0.05/2, 0.03 <= 0.05
    assert holm_count([0.5, 0.001]) == 1 and holm_count([0.2, 0.3]) == 0
    note = comparisons_note(np.linspace(0.5, 7.0, 14), p_values)
    assert "Holm, 5%), 1 pair(s) stay significant" in note
    assert "ahead in 14 of 14 pairs (two-sided sign test p = 0.00012)" in note  # 2 x 0.5 ** 14
