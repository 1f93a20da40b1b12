"""Order-book data: the synthetic generator, the npz format, and the three CSV loaders (fixtures written here)."""

import dataclasses

import numpy as np
import pytest

from rlx.envs.market import data, synthetic
from rlx.envs.market.data import BookDay, DataError

SMALL = synthetic.SyntheticMarket(levels=16, seconds=600)


@pytest.fixture(scope="module")
def days():
    return synthetic.generate_days(3, seed=4, market=SMALL)


def test_synthetic_days_are_deterministic_valid_and_seed_dependent(days):
    again = synthetic.generate_days(3, seed=4, market=SMALL)
    for day, copy in zip(days, again):
        np.testing.assert_array_equal(day.bid_prices, copy.bid_prices)
        np.testing.assert_array_equal(day.trade_sizes, copy.trade_sizes)
        data.validate(day, day.name)
    other = synthetic.generate_days(1, seed=5, market=SMALL)[0]
    assert not np.array_equal(other.bid_sizes, days[0].bid_sizes)


def test_synthetic_trades_are_consistent_with_the_book(days):
    """Sell trades print at bid prices of the snapshot before them, buys at ask prices; levels on the tick grid."""
    day = days[0]
    before = np.searchsorted(day.timestamps, day.trade_times) - 1
    previous_best_bid = np.where(before >= 0, day.bid_prices[np.maximum(before, 0), 0], day.bid_prices[0, 0] + 1)
    previous_best_ask = np.where(before >= 0, day.ask_prices[np.maximum(before, 0), 0], day.ask_prices[0, 0] - 1)
    sells, buys = day.trade_sides < 0, day.trade_sides > 0
    assert sells.any() and buys.any()
    assert np.all(day.trade_prices[sells] <= previous_best_bid[sells] + 1)  # at or below the best (an improvement at most)
    assert np.all(day.trade_prices[buys] >= previous_best_ask[buys] - 1)
    np.testing.assert_array_equal(np.diff(day.bid_prices, axis=1), -1)
    np.testing.assert_array_equal(np.diff(day.ask_prices, axis=1), 1)


def test_volatile_regime_moves_the_mid_more_than_calm():
    market = synthetic.SyntheticMarket(levels=16, seconds=1800)
    import jax

    calm = synthetic.simulate_day(jax.random.PRNGKey(0), market, 0, 1.0)
    volatile = synthetic.simulate_day(jax.random.PRNGKey(0), market, 2, 1.0)
    moves = lambda out: int(np.count_nonzero(np.diff(np.asarray(out[0]) + np.asarray(out[1]))))  # noqa: E731
    assert moves(volatile) > 2 * moves(calm)


def test_npz_round_trip_and_manifest(tmp_path, days):
    # As many days as the fixture: the same compiled generator, so the same numbers to the last bit.
    paths = synthetic.write_days(tmp_path, 3, seed=4, market=SMALL)
    for path, day in zip(paths, days, strict=True):
        loaded = data.load_day(path)
        for name in data.ARRAYS:
            np.testing.assert_array_equal(getattr(loaded, name), getattr(day, name))
    assert loaded.tick_size == pytest.approx(SMALL.tick_size)
    assert "regimes" in (tmp_path / "manifest.json").read_text()


def test_npz_missing_arrays_name_the_file(tmp_path):
    np.savez(tmp_path / "day_000.npz", timestamps=np.arange(3.0))
    with pytest.raises(DataError, match="day_000.npz.*missing"):
        data.load_day(tmp_path / "day_000.npz")


def test_empty_truncated_and_misshapen_npz_files_name_themselves(tmp_path, days):
    whole = data.save_day(days[0], tmp_path / "day_000.npz")
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "truncated.npz").write_bytes(whole.read_bytes()[:100])
    for name in ("empty.npz", "truncated.npz"):
        with pytest.raises(DataError, match=f"{name}: cannot read as .npz"):
            data.load_day(tmp_path / name)
    short_book = dataclasses.replace(days[0], bid_sizes=days[0].bid_sizes[:-10])
    with pytest.raises(DataError, match="short.npz: book arrays must be.*bid_sizes"):
        data.load_day(data.save_day(short_book, tmp_path / "short.npz"))
    short_trades = dataclasses.replace(days[0], trade_sides=days[0].trade_sides[:-1])
    with pytest.raises(DataError, match="trades.npz: trade arrays must be .* of one length"):
        data.load_day(data.save_day(short_trades, tmp_path / "trades.npz"))


def write_snapshot_csv(day: BookDay, book_path, trades_path, levels: int):
    header = ["timestamp"] + [f"{s}_{k}_{i}" for s in ("bid", "ask") for i in range(1, levels + 1) for k in ("price", "size")]
    lines = [",".join(header)]
    for t in range(len(day.timestamps)):
        cells = [f"{day.timestamps[t]:.3f}"]
        for prices, sizes in ((day.bid_prices, day.bid_sizes), (day.ask_prices, day.ask_sizes)):
            for i in range(levels):
                cells += [f"{prices[t, i] * day.tick_size:.1f}", f"{sizes[t, i]:.9g}"]
        lines.append(",".join(cells))
    book_path.write_text("\n".join(lines) + "\n")
    trades = ["timestamp,price,size,side"] + [
        f"{t:.3f},{p * day.tick_size:.1f},{s:.9g},{'buy' if side > 0 else 'sell'}"
        for t, p, s, side in zip(day.trade_times, day.trade_prices, day.trade_sizes, day.trade_sides)]
    trades_path.write_text("\n".join(trades) + "\n")


def test_snapshot_csv_loads_what_was_written(tmp_path, days):
    day = days[1]
    write_snapshot_csv(day, tmp_path / "book.csv", tmp_path / "trades.csv", levels=16)
    loaded = data.load_snapshot_csv(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.1)
    np.testing.assert_array_equal(loaded.bid_prices, day.bid_prices)
    np.testing.assert_array_equal(loaded.ask_prices, day.ask_prices)
    np.testing.assert_allclose(loaded.ask_sizes, day.ask_sizes, atol=1e-6)
    np.testing.assert_array_equal(loaded.trade_sides, day.trade_sides)
    np.testing.assert_allclose(loaded.trade_times, day.trade_times, atol=1e-3)


def corrupt(path, line: int, column: int, value: str):
    rows = path.read_text().splitlines()
    cells = rows[line - 1].split(",")
    cells[column] = value
    rows[line - 1] = ",".join(cells)
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("column, value, message", [
    (0, "0.5", "timestamp out of order"),  # timestamps are 1, 2, 3, ...: 0.5 at line 6 goes back in time
    (2, "-3", "negative or missing bid size"),
    (1, "1000000.0", "crossed book"),
    (1, "100.05", "price not a multiple of tick_size"),
    (2, "abc", "not a number"),
    (0, "nan", "not a finite number"),
    (3, "inf", "not a finite number"),
])
def test_malformed_snapshot_csv_names_file_and_line(tmp_path, days, column, value, message):
    write_snapshot_csv(days[0], tmp_path / "book.csv", tmp_path / "trades.csv", levels=16)
    corrupt(tmp_path / "book.csv", 6, column, value)
    with pytest.raises(DataError, match=rf"book.csv, line 6: {message}"):
        data.load_snapshot_csv(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.1)


def test_malformed_trades_csv_names_its_file(tmp_path, days):
    write_snapshot_csv(days[0], tmp_path / "book.csv", tmp_path / "trades.csv", levels=16)
    corrupt(tmp_path / "trades.csv", 4, 3, "hold")
    with pytest.raises(DataError, match=r"trades.csv, line 4: side 'hold'"):
        data.load_snapshot_csv(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.1)
    corrupt(tmp_path / "trades.csv", 4, 3, "buy")
    corrupt(tmp_path / "trades.csv", 5, 2, "-1")
    with pytest.raises(DataError, match=r"trades.csv, line 5: trade size not positive"):
        data.load_snapshot_csv(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.1)


def test_lobster_files_load_with_trade_sides_and_empty_levels(tmp_path):
    # time, type, order id, size, price (1e-4), direction; type 4 = execution; direction 1 = a buy limit order.
    messages = ["34200.1,1,11,5,1000100,1", "34200.2,4,11,2,1000100,1", "34200.2,1,12,3,1000300,-1",
                "34200.5,4,12,1,1000300,-1"]
    # ask price, ask size, bid price, bid size for 2 levels; the second bid level is empty (LOBSTER's dummy price).
    books = ["1000300,4,1000100,5,1000400,6,-9999999999,0", "1000300,4,1000100,3,1000400,6,-9999999999,0",
             "1000300,7,1000100,3,1000400,6,-9999999999,0", "1000300,6,1000100,3,1000400,6,-9999999999,0"]
    (tmp_path / "msg.csv").write_text("\n".join(messages) + "\n")
    (tmp_path / "book.csv").write_text("\n".join(books) + "\n")
    day = data.load_lobster(tmp_path / "msg.csv", tmp_path / "book.csv", tick_size=0.01)
    np.testing.assert_array_equal(day.timestamps, [34200.1, 34200.2, 34200.5])  # same-time messages: last book kept
    np.testing.assert_array_equal(day.bid_prices, [[10001, 10000]] * 3)
    np.testing.assert_array_equal(day.ask_sizes[:, 0], [4, 7, 6])
    np.testing.assert_array_equal(day.trade_sides, [-1, 1])  # buy limit executed = aggressor sold
    np.testing.assert_array_equal(day.trade_prices, [10001, 10003])
    (tmp_path / "book.csv").write_text("\n".join(books[:3]) + "\n")
    with pytest.raises(DataError, match="book.csv.*3 book rows for 4 messages"):
        data.load_lobster(tmp_path / "msg.csv", tmp_path / "book.csv", tick_size=0.01)
    (tmp_path / "book.csv").write_text("\n".join(books) + "\n")
    (tmp_path / "msg.csv").write_text("\n".join([*messages[:3], messages[3].replace("34200.5", "34200.15")]) + "\n")
    with pytest.raises(DataError, match="msg.csv, line 4: timestamp out of order"):  # the message file's times
        data.load_lobster(tmp_path / "msg.csv", tmp_path / "book.csv", tick_size=0.01)


def test_lobster_empty_levels_continue_past_a_price_gap_and_one_sided_books_are_left_out(tmp_path):
    messages = ["34200.1,1,11,5,1000100,1", "34200.2,3,13,4,1000300,-1", "34200.3,1,13,4,1000300,-1"]
    # 3 levels. Asks at 100.03 and 100.07 (LOBSTER's levels are occupied prices, so gaps are normal), the third
    # level empty; the second row has no ask at all (the only one was cancelled): a one-sided book.
    books = ["1000300,4,1000100,5,1000700,6,1000000,2,9999999999,0,999900,1",
             "9999999999,0,1000100,5,9999999999,0,1000000,2,9999999999,0,999900,1",
             "1000300,4,1000100,5,1000700,6,1000000,2,9999999999,0,-9999999999,0"]
    (tmp_path / "msg.csv").write_text("\n".join(messages) + "\n")
    (tmp_path / "book.csv").write_text("\n".join(books) + "\n")
    day = data.load_lobster(tmp_path / "msg.csv", tmp_path / "book.csv", tick_size=0.01)
    np.testing.assert_array_equal(day.timestamps, [34200.1, 34200.3])
    np.testing.assert_array_equal(day.ask_prices, [[10003, 10007, 10008]] * 2)
    np.testing.assert_array_equal(day.ask_sizes[:, 2], [0, 0])
    np.testing.assert_array_equal(day.bid_prices, [[10001, 10000, 9999], [10001, 10000, 9999]])
    np.testing.assert_array_equal(day.bid_sizes[:, 2], [1, 0])
    np.testing.assert_array_equal(day.mid(), [10002, 10002])


def test_empty_files_name_themselves_and_a_quiet_day_has_no_trades(tmp_path, days):
    with pytest.raises(DataError, match="missing.csv: no such file"):
        data.load_snapshot_csv(tmp_path / "missing.csv", tmp_path / "trades.csv", tick_size=0.1)
    for name in ("msg.csv", "book.csv"):
        (tmp_path / name).write_text("")
    with pytest.raises(DataError, match="msg.csv: no rows"):
        data.load_lobster(tmp_path / "msg.csv", tmp_path / "book.csv", tick_size=0.01)
    write_snapshot_csv(days[0], tmp_path / "book.csv", tmp_path / "trades.csv", levels=16)
    (tmp_path / "trades.csv").write_text("timestamp,price,size,side\n")
    day = data.load_snapshot_csv(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.1)
    assert day.trade_times.shape == day.trade_prices.shape == (0,) and len(day.timestamps) == len(days[0].timestamps)


TARDIS_BOOK = """exchange,symbol,timestamp,local_timestamp,is_snapshot,side,price,amount
x,BTC,1000000,1000001,true,bid,100.0,2
x,BTC,1000000,1000001,true,bid,99.5,3
x,BTC,1000000,1000001,true,ask,100.5,1
x,BTC,1000000,1000001,true,ask,101.0,4
x,BTC,2000000,2000001,false,ask,100.5,0
x,BTC,2000000,2000001,false,bid,100.5,5
x,BTC,3000000,3000001,false,bid,99.5,1.5
"""
TARDIS_TRADES = """exchange,symbol,timestamp,local_timestamp,id,side,price,amount
x,BTC,1500000,1500001,a,buy,100.5,1
x,BTC,2500000,2500001,b,sell,100.5,0.5
"""


def test_tardis_incremental_book_is_replayed(tmp_path):
    (tmp_path / "book.csv").write_text(TARDIS_BOOK)
    (tmp_path / "trades.csv").write_text(TARDIS_TRADES)
    day = data.load_tardis(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.5, levels=3)
    np.testing.assert_allclose(day.timestamps, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(day.bid_prices[1], [201, 200, 199])  # 100.5, 100.0, 99.5 in 0.5 ticks
    np.testing.assert_allclose(day.bid_sizes[2], [5, 2, 1.5])
    np.testing.assert_array_equal(day.ask_prices[1], [202, 203, 204])  # 100.5 deleted; the third level is empty
    np.testing.assert_allclose(day.ask_sizes[1], [4, 0, 0])
    np.testing.assert_array_equal(day.trade_sides, [1, -1])


def test_tardis_errors_name_the_line(tmp_path):
    (tmp_path / "trades.csv").write_text(TARDIS_TRADES)
    (tmp_path / "book.csv").write_text(TARDIS_BOOK.replace("x,BTC,3000000,3000001,false,bid,99.5,1.5",
                                                          "x,BTC,3000000,3000001,false,bid,99.5,-1"))
    with pytest.raises(DataError, match="book.csv, line 8: negative amount"):
        data.load_tardis(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.5)
    (tmp_path / "book.csv").write_text(TARDIS_BOOK.replace("false,bid,100.5,5", "false,bid,101.5,5"))
    with pytest.raises(DataError, match="book.csv, line 7: crossed book"):
        data.load_tardis(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.5)
    # Rows are compared with the row before, also while one side is empty and no snapshot is taken.
    (tmp_path / "book.csv").write_text(TARDIS_BOOK.replace("x,BTC,2000000,2000001,false,bid,100.5,5",
                                                          "x,BTC,1500000,1500001,false,bid,100.5,5"))
    with pytest.raises(DataError, match="book.csv, line 7: timestamp out of order"):
        data.load_tardis(tmp_path / "book.csv", tmp_path / "trades.csv", tick_size=0.5)
