"""Order-book days: one in-memory format, its file format, and loaders for three public formats.

A ``BookDay`` holds one trading day of level-2 snapshots plus the trades between them:

- ``timestamps`` ``[T]`` float64 seconds, strictly increasing;
- ``bid_prices`` / ``ask_prices`` ``[T, L]`` int64 ticks (``price / tick_size``), best first:
  bids strictly decreasing, asks strictly increasing, best bid < best ask;
- ``bid_sizes`` / ``ask_sizes`` ``[T, L]`` float64, >= 0 (0 marks an empty level);
- ``trade_times`` ``[K]`` (non-decreasing), ``trade_prices`` ``[K]`` ticks, ``trade_sizes`` ``[K]`` > 0,
  ``trade_sides`` ``[K]``: +1 when the aggressor bought (lifting asks), -1 when it sold (hitting bids);
- ``tick_size`` (price units per tick) and a ``name``.

**File format** (what ``save_day`` writes and ``load_day`` reads): one NumPy ``.npz`` per day
with exactly those arrays plus ``tick_size`` and ``name`` as 0-d arrays.

**Loaders** (everything they return passes ``validate``; a malformed file raises one
``DataError`` naming the file and the line):

- ``load_snapshot_csv(book_csv, trades_csv, tick_size)``: a generic L2 CSV with header
  ``timestamp,bid_price_1,bid_size_1,...,bid_price_L,bid_size_L,ask_price_1,ask_size_1,...`` and a
  trades CSV ``timestamp,price,size,side`` (side ``buy`` or ``sell``, the aggressor's);
- ``load_lobster(message_csv, orderbook_csv, tick_size)``: LOBSTER's message file (time, type,
  order id, size, price, direction) and order-book file (ask price, ask size, bid price, bid size per
  level; prices in 1e-4 currency units); executions (types 4 and 5) become trades, a buy limit order
  executed (direction 1) being a sell by the aggressor; empty levels past a side's last order continue
  its tick grid with size 0, and books with an empty side are left out;
- ``load_tardis(book_csv, trades_csv, tick_size, levels)``: Tardis-style ``incremental_book_L2``
  (``exchange,symbol,timestamp,local_timestamp,is_snapshot,side,price,amount``, amount 0 deletes the
  level, timestamps in microseconds) replayed into a book, one snapshot per distinct timestamp, and
  its ``trades`` file (``...,timestamp,local_timestamp,id,side,price,amount``).
"""

from __future__ import annotations

import csv
import dataclasses
import zipfile
from pathlib import Path

import numpy as np

from rlx.errors import InputError


class DataError(InputError):
    """A malformed data file: the message names the file and the line."""


@dataclasses.dataclass
class BookDay:
    timestamps: np.ndarray
    bid_prices: np.ndarray
    bid_sizes: np.ndarray
    ask_prices: np.ndarray
    ask_sizes: np.ndarray
    trade_times: np.ndarray
    trade_prices: np.ndarray
    trade_sizes: np.ndarray
    trade_sides: np.ndarray
    tick_size: float
    name: str = "day"

    @property
    def levels(self) -> int:
        return self.bid_prices.shape[1]

    def mid(self) -> np.ndarray:
        """Mid price in ticks (may be a half tick), per snapshot."""
        return 0.5 * (self.bid_prices[:, 0] + self.ask_prices[:, 0])


ARRAYS = [f.name for f in dataclasses.fields(BookDay) if f.name not in ("tick_size", "name")]


def check_shapes(day: BookDay, source: str) -> None:
    """Raise ``DataError`` unless every book array is ``[snapshots, levels]`` and the trade arrays share a length."""
    book = {name: getattr(day, name).shape for name in ("bid_prices", "bid_sizes", "ask_prices", "ask_sizes")}
    expected = (len(day.timestamps), day.levels) if day.bid_prices.ndim == 2 else None
    if any(shape != expected for shape in book.values()):
        raise DataError(f"{source}: book arrays must be [snapshots, levels] = [{len(day.timestamps)}, L] "
                        f"for {len(day.timestamps)} timestamps; got {', '.join(f'{n} {s}' for n, s in book.items())}")
    trades = {name: getattr(day, name).shape for name in ("trade_times", "trade_prices", "trade_sizes", "trade_sides")}
    if len(set(trades.values())) != 1 or len(trades["trade_times"]) != 1:
        raise DataError(f"{source}: trade arrays must be one-dimensional and of one length; got "
                        + ", ".join(f"{n} {s}" for n, s in trades.items()))


def validate(day: BookDay, source: str, book_lines=None, trade_lines=None, trade_source: str | None = None) -> BookDay:
    """Raise ``DataError`` at the first bad row; ``*_lines[i]`` is the file line of row ``i`` (default i + 2)."""
    book_line = (lambda i: int(book_lines[i])) if book_lines is not None else (lambda i: i + 2)
    trade_line = (lambda i: int(trade_lines[i])) if trade_lines is not None else (lambda i: i + 2)

    def fail(row_mask, what, line_of, file=source):
        rows = np.flatnonzero(row_mask)
        if rows.size:
            raise DataError(f"{file}, line {line_of(rows[0])}: {what}")

    if len(day.timestamps) < 2:
        raise DataError(f"{source}: fewer than two book snapshots")
    check_shapes(day, source)
    fail(np.diff(day.timestamps, prepend=-np.inf) <= 0, "timestamp out of order (not after the previous row)", book_line)
    for side in ("bid", "ask"):
        sizes = getattr(day, f"{side}_sizes")
        fail((sizes < 0).any(axis=1) | ~np.isfinite(sizes).all(axis=1), f"negative or missing {side} size", book_line)
    present_bid, present_ask = day.bid_sizes[:, 0] > 0, day.ask_sizes[:, 0] > 0
    fail(present_bid & present_ask & (day.bid_prices[:, 0] >= day.ask_prices[:, 0]),
         "crossed book (best bid >= best ask)", book_line)
    fail((np.diff(day.bid_prices, axis=1) >= 0).any(axis=1), "bid prices not strictly decreasing", book_line)
    fail((np.diff(day.ask_prices, axis=1) <= 0).any(axis=1), "ask prices not strictly increasing", book_line)
    if len(day.trade_times):
        trades = trade_source or source
        fail(np.diff(day.trade_times, prepend=-np.inf) < 0, "trade timestamp out of order", trade_line, trades)
        fail(~(day.trade_sizes > 0), "trade size not positive", trade_line, trades)
        fail(~np.isin(day.trade_sides, (-1, 1)), "trade side must be buy or sell", trade_line, trades)
    return day


def save_day(day: BookDay, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **{name: getattr(day, name) for name in ARRAYS},
                        tick_size=np.float64(day.tick_size), name=np.str_(day.name))
    return path


def load_day(path) -> BookDay:
    path = Path(path)
    try:
        with np.load(path) as stored:
            missing = [name for name in (*ARRAYS, "tick_size") if name not in stored]
            if missing:
                raise DataError(f"{path}: not an rlx book day (missing {', '.join(missing)})")
            arrays = {name: stored[name] for name in ARRAYS}
            day = BookDay(**arrays, tick_size=float(stored["tick_size"]),
                          name=str(stored["name"]) if "name" in stored else path.stem)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:  # empty or truncated files included
        if isinstance(error, DataError):
            raise
        raise DataError(f"{path}: cannot read as .npz ({error})") from error
    return validate(day, str(path))


def to_ticks(prices: np.ndarray, tick_size: float, source: str, lines) -> np.ndarray:
    ticks = np.rint(prices / tick_size)
    off_grid = np.abs(ticks * tick_size - prices) > 1e-6 * max(tick_size, 1e-12) + 1e-9 * np.abs(prices)
    rows = np.flatnonzero(off_grid if off_grid.ndim == 1 else off_grid.any(axis=1))
    if rows.size:
        raise DataError(f"{source}, line {lines[rows[0]]}: price not a multiple of tick_size={tick_size}")
    return ticks.astype(np.int64)


def read_rows(path, header: list[str] | None, min_columns: int) -> tuple[list[list[str]], list[int]]:
    """CSV rows as strings with their file line numbers; checks the header and the column count."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows, lines = [], []
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        if header is not None:
            found = next(reader, None)
            if found is None or [c.strip() for c in found[: len(header)]] != header:
                raise DataError(f"{path}, line 1: header must begin {','.join(header)}")
        for row in reader:
            if not row:
                continue
            if len(row) < min_columns:
                raise DataError(f"{path}, line {reader.line_num}: {len(row)} columns, expected {min_columns}")
            rows.append(row)
            lines.append(reader.line_num)
    return rows, lines


def numbers(rows, columns, path, lines) -> np.ndarray:
    """Float array of the given columns; a non-number names its line."""
    out = np.empty((len(rows), len(columns)))
    for i, row in enumerate(rows):
        try:
            out[i] = [float(row[c]) for c in columns]
        except ValueError:
            raise DataError(f"{path}, line {lines[i]}: not a number in {[row[c] for c in columns]}") from None
        if not np.isfinite(out[i]).all():  # float() reads "nan" and "inf"
            raise DataError(f"{path}, line {lines[i]}: not a finite number in {[row[c] for c in columns]}")
    return out


def sides(values, path, lines, buy=("buy", "b"), sell=("sell", "s")) -> np.ndarray:
    out = np.empty(len(values), np.int64)
    for i, value in enumerate(values):
        token = value.strip().lower()
        if token in buy:
            out[i] = 1
        elif token in sell:
            out[i] = -1
        else:
            raise DataError(f"{path}, line {lines[i]}: side {value!r} is neither buy nor sell")
    return out


def load_snapshot_csv(book_csv, trades_csv, tick_size: float, name: str | None = None) -> BookDay:
    """The generic L2 snapshot CSV plus a trades CSV (formats in the module docstring)."""
    book_csv, trades_csv = Path(book_csv), Path(trades_csv)
    if not book_csv.is_file():
        raise DataError(f"{book_csv}: no such file")
    with book_csv.open() as handle:
        header = [c.strip() for c in handle.readline().split(",")]
    levels = sum(1 for c in header if c.startswith("bid_price_"))
    expected = ["timestamp"] + [f"{s}_{k}_{i}" for s in ("bid", "ask") for i in range(1, levels + 1) for k in ("price", "size")]
    if levels == 0 or header != expected:
        raise DataError(f"{book_csv}, line 1: header must be timestamp,bid_price_1,bid_size_1,...,ask_price_1,"
                        "ask_size_1,... (bids then asks, L levels each)")
    rows, lines = read_rows(book_csv, expected, len(expected))
    if not rows:
        raise DataError(f"{book_csv}: no snapshots")
    values = numbers(rows, range(len(expected)), book_csv, lines)
    bids, asks = values[:, 1 : 1 + 2 * levels], values[:, 1 + 2 * levels :]
    trade_rows, trade_lines = read_rows(trades_csv, ["timestamp", "price", "size", "side"], 4)
    trade_values = numbers(trade_rows, range(3), trades_csv, trade_lines).reshape(-1, 3)
    day = BookDay(
        timestamps=values[:, 0],
        bid_prices=to_ticks(bids[:, 0::2], tick_size, str(book_csv), lines), bid_sizes=bids[:, 1::2],
        ask_prices=to_ticks(asks[:, 0::2], tick_size, str(book_csv), lines), ask_sizes=asks[:, 1::2],
        trade_times=trade_values[:, 0],
        trade_prices=to_ticks(trade_values[:, 1], tick_size, str(trades_csv), trade_lines),
        trade_sizes=trade_values[:, 2],
        trade_sides=sides([r[3] for r in trade_rows], trades_csv, trade_lines),
        tick_size=tick_size, name=name or book_csv.stem,
    )
    return validate(day, str(book_csv), lines, trade_lines, str(trades_csv))


LOBSTER_PRICE_UNIT = 1e-4  # LOBSTER stores prices as integers in 1/10000 of a currency unit


def load_lobster(message_csv, orderbook_csv, tick_size: float, name: str | None = None) -> BookDay:
    """LOBSTER's message + order-book files (no headers; one book row per message)."""
    message_csv, orderbook_csv = Path(message_csv), Path(orderbook_csv)
    message_rows, message_lines = read_rows(message_csv, None, 6)
    book_rows, book_lines = read_rows(orderbook_csv, None, 4)
    for path, rows in ((message_csv, message_rows), (orderbook_csv, book_rows)):
        if not rows:
            raise DataError(f"{path}: no rows")
    if len(message_rows) != len(book_rows):
        raise DataError(f"{orderbook_csv}, line {min(len(message_rows), len(book_rows)) + 1}: {len(book_rows)} book "
                        f"rows for {len(message_rows)} messages (LOBSTER writes one per message)")
    widths = {len(row) for row in book_rows}
    if len(widths) != 1 or widths.pop() % 4:
        bad = next(i for i, row in enumerate(book_rows) if len(row) != len(book_rows[0]) or len(row) % 4)
        raise DataError(f"{orderbook_csv}, line {book_lines[bad]}: a row must have 4 columns per level")
    messages = numbers(message_rows, range(6), message_csv, message_lines)
    book = numbers(book_rows, range(len(book_rows[0])), orderbook_csv, book_lines)
    ask_prices, ask_sizes, bid_prices, bid_sizes = (book[:, i::4] for i in range(4))
    tick = tick_size / LOBSTER_PRICE_UNIT
    ask_prices = continue_tick_grid(ask_prices, ask_sizes > 0, tick)
    bid_prices = continue_tick_grid(bid_prices, bid_sizes > 0, -tick)
    # Several messages can share a timestamp: keep the book after the last of them, if it has both sides
    # (as ``load_tardis`` keeps only two-sided books).
    times = messages[:, 0]
    backwards = np.flatnonzero(np.diff(times) < 0)
    if backwards.size:  # the times are the message file's: name its line, not the book's
        raise DataError(f"{message_csv}, line {message_lines[backwards[0] + 1]}: timestamp out of order "
                        "(before the previous row)")
    last = np.append(times[1:] != times[:-1], True)
    kept = last & (ask_sizes[:, 0] > 0) & (bid_sizes[:, 0] > 0)
    kept_lines = np.asarray(book_lines)[kept]
    executions = np.isin(messages[:, 1], (4, 5))
    day = BookDay(
        timestamps=times[kept],
        bid_prices=to_ticks(bid_prices[kept] * LOBSTER_PRICE_UNIT, tick_size, str(orderbook_csv), kept_lines),
        bid_sizes=bid_sizes[kept],
        ask_prices=to_ticks(ask_prices[kept] * LOBSTER_PRICE_UNIT, tick_size, str(orderbook_csv), kept_lines),
        ask_sizes=ask_sizes[kept],
        trade_times=times[executions],
        trade_prices=to_ticks(messages[executions, 4] * LOBSTER_PRICE_UNIT, tick_size, str(message_csv),
                              np.asarray(message_lines)[executions]),
        trade_sizes=messages[executions, 3],
        trade_sides=-messages[executions, 5].astype(np.int64),
        tick_size=tick_size, name=name or orderbook_csv.stem,
    )
    return validate(day, str(orderbook_csv), kept_lines, np.asarray(message_lines)[executions], str(message_csv))


def continue_tick_grid(prices: np.ndarray, present: np.ndarray, step: float) -> np.ndarray:
    """``prices [T, L]`` with each empty level (``present`` False: LOBSTER writes a dummy price and size 0
    past a side's last occupied level) priced one ``step`` beyond the level before it, so the side stays
    strictly monotone; a side with no order at all keeps its dummy prices (such books are not kept)."""
    out = prices.copy()
    for level in range(1, prices.shape[1]):
        out[:, level] = np.where(present[:, level], prices[:, level], out[:, level - 1] + step)
    return out


TARDIS_BOOK_HEADER = ["exchange", "symbol", "timestamp", "local_timestamp", "is_snapshot", "side", "price", "amount"]
TARDIS_TRADES_HEADER = ["exchange", "symbol", "timestamp", "local_timestamp", "id", "side", "price", "amount"]


def load_tardis(book_csv, trades_csv, tick_size: float, levels: int = 15, name: str | None = None) -> BookDay:
    """Replay Tardis ``incremental_book_L2`` updates; one snapshot (top ``levels``) per distinct timestamp."""
    book_csv, trades_csv = Path(book_csv), Path(trades_csv)
    rows, lines = read_rows(book_csv, TARDIS_BOOK_HEADER, 8)
    values = numbers(rows, (2, 6, 7), book_csv, lines)
    is_bid = sides([r[5] for r in rows], book_csv, lines, buy=("bid",), sell=("ask",)) == 1
    books = {True: {}, False: {}}
    times, snapshot_lines, snapshots = [], [], []
    for i, (timestamp, price, amount) in enumerate(values):
        if amount < 0:
            raise DataError(f"{book_csv}, line {lines[i]}: negative amount {amount}")
        if i and timestamp < values[i - 1, 0]:
            raise DataError(f"{book_csv}, line {lines[i]}: timestamp out of order (not after the previous row)")
        if rows[i][4].strip().lower() == "true" and (i == 0 or rows[i - 1][4].strip().lower() != "true"):
            books = {True: {}, False: {}}  # a new snapshot replaces the book
        side = books[bool(is_bid[i])]
        if amount == 0:
            side.pop(price, None)
        else:
            side[price] = amount
        last_of_time = i + 1 == len(values) or values[i + 1, 0] != timestamp
        if last_of_time and books[True] and books[False]:
            snapshots.append(top_levels(books, levels, tick_size))
            times.append(timestamp)
            snapshot_lines.append(lines[i])
    if len(snapshots) < 2:
        raise DataError(f"{book_csv}: fewer than two snapshots with both sides of the book")
    bid_prices, bid_sizes, ask_prices, ask_sizes = (np.array(a) for a in zip(*snapshots))
    trade_rows, trade_lines = read_rows(trades_csv, TARDIS_TRADES_HEADER, 8)
    trade_values = numbers(trade_rows, (2, 6, 7), trades_csv, trade_lines).reshape(-1, 3)
    day = BookDay(
        timestamps=np.array(times) * 1e-6,
        bid_prices=to_ticks(bid_prices, tick_size, str(book_csv), snapshot_lines), bid_sizes=bid_sizes,
        ask_prices=to_ticks(ask_prices, tick_size, str(book_csv), snapshot_lines), ask_sizes=ask_sizes,
        trade_times=trade_values[:, 0] * 1e-6,
        trade_prices=to_ticks(trade_values[:, 1], tick_size, str(trades_csv), trade_lines),
        trade_sizes=trade_values[:, 2],
        trade_sides=sides([r[5] for r in trade_rows], trades_csv, trade_lines),
        tick_size=tick_size, name=name or book_csv.stem,
    )
    return validate(day, str(book_csv), snapshot_lines, trade_lines, str(trades_csv))


def top_levels(books: dict, levels: int, tick_size: float):
    """Best ``levels`` of each side; missing levels continue the tick grid with size 0."""
    out = []
    for is_bid in (True, False):
        prices = sorted(books[is_bid], reverse=is_bid)[:levels]
        sizes = [books[is_bid][p] for p in prices]
        step = -tick_size if is_bid else tick_size
        while len(prices) < levels:
            prices.append(prices[-1] + step)
            sizes.append(0.0)
        out += [prices, sizes]
    return out
