"""Event- versus time-based stepping for market making: ``python -m rlx.reproduce mm_event_vs_time [--quick]``.

The design follows the two papers the market-making issue cites: 8 training days, 30 test
days; agents A2C and PPO; the seven rewards of ``rlx.envs.market.rewards``; stepping every 10 s
versus whenever the mid moves 2 bps; 5 seeds. Data: synthetic days (``rlx.envs.market.synthetic``,
seed 0, regimes drawn per day) unless ``experiments/mm_event_vs_time/config.yaml`` names a
directory of ``day_*.npz`` files (``data_dir: ...``, chronological by name).

One compiled program per (agent, stepping) trains all 7 rewards x 5 seeds together (``vmap``
over the reward index, a leaf of the environment parameters, and the seeds), with the vendorable
agents' ``train``. Every trained policy then plays every test day greedily (the environment is
deterministic given the actions), next to the baselines: do nothing; fixed quotes at levels
(1, 1) and (5, 5); Avellaneda-Stoikov and Gueant-Lehalle-Fernandez-Tapia with sigma, A and k
fitted on the training days and gamma chosen on them, their depths mapped to the nearest level
pair.

Plots: cumulative PnL over the test days (``equity.png``) and the inventory path on the first test
day (``inventory.png``) of the best configuration per agent and of the baselines.

Metrics per test day (``results.json``, ``per_test_day``: per seed for learned rows): PnL (currency,
one unit per order), mean absolute position (MAP), fills, market orders, decisions. Over the 30 days: mean daily PnL, Sharpe and Sortino of daily PnL, maximum
drawdown of the cumulative PnL, PnL-to-MAP, fills per decision. Event versus time: per agent and
reward, the difference of mean daily PnL with a 95% Welch interval over seeds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rlx.envs.market import baselines, book, rewards, synthetic
from rlx.envs.market import data as data_lib
from rlx.report import t_interval

TRAIN_DAYS, TEST_DAYS, SEEDS = 8, 30, 5
STEPPINGS = {"time": dict(interval=10.0, threshold_bps=2.0), "event": dict(interval=10.0, threshold_bps=2.0)}
WINDOW = 10
GAMMAS = (0.001, 0.01, 0.1)


def load_days(out: Path, quick: bool) -> list[data_lib.BookDay]:
    config = out / "config.yaml"
    data_dir = None
    if config.is_file():
        from omegaconf import OmegaConf

        data_dir = OmegaConf.load(config).get("data_dir")
    if data_dir:
        paths = sorted(Path(data_dir).glob("day_*.npz"))
        if len(paths) < TRAIN_DAYS + 1:
            raise data_lib.DataError(f"{data_dir}: {len(paths)} day_*.npz files; the study needs at least {TRAIN_DAYS + 1}")
        return [data_lib.load_day(p) for p in paths]
    market = synthetic.SyntheticMarket(seconds=1800) if quick else synthetic.SyntheticMarket()
    return synthetic.generate_days(4 if quick else TRAIN_DAYS + TEST_DAYS, seed=0, market=market)


def agent_setup(name: str, quick: bool):
    from rlx.agents import a2c, ppo

    steps = 8192 if quick else 245_760
    if name == "ppo":
        return ppo, ppo.Config(total_timesteps=steps, num_envs=16, num_steps=128, num_epochs=4, num_minibatches=4,
                               lr=3e-4, ent_coef=0.01, gamma=0.99, normalize_observations=True,
                               normalize_rewards=True)
    return a2c, a2c.Config(total_timesteps=steps, num_envs=16, num_steps=16, lr=7e-4, ent_coef=0.01, gamma=0.99,
                           gae_lambda=0.95, normalize_observations=True, normalize_advantages=True)


def train_all(module, config, env, params, key, seeds: int):
    """Policies ``[7 * seeds]`` (reward-major) trained in one program."""
    reward_ids = jnp.repeat(jnp.arange(len(rewards.REWARDS)), seeds)

    def one(reward_id, seed_key):
        chosen = params.replace(rewards=params.rewards.replace(reward=reward_id))
        state, _ = module.train(config, env, chosen, seed_key)
        return state.policy

    return jax.jit(jax.vmap(one))(reward_ids, jax.random.split(key, len(reward_ids)))


def play_days(env: book.BookEnv, params: book.BookParams, choose):
    """Greedy play of every day in ``params``; ``choose(obs, state) -> action``. Per day and step arrays."""
    steps = int(params.bid_prices.shape[1]) - 1
    key = jax.random.PRNGKey(0)

    def day_episode(day):
        day_params = params.replace(day=day)
        obs, state = env.reset(key, day_params)

        def step(carry, _):
            obs, state, done = carry
            action = choose(obs, state)
            next_obs, next_state, _, terminated, info = env.step_env(key, state, action, day_params)
            keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(done, b, a), new, old)  # noqa: E731
            record = {"wealth": info["wealth"], "inventory": info["inventory"],
                      "fills": info["bid_fill"] + info["ask_fill"], "market": info["market_orders"],
                      "active": ~done}
            return (keep(next_obs, obs), keep(next_state, state), done | terminated), record

        _, out = jax.lax.scan(step, (obs, state, jnp.bool_(False)), None, steps)
        return out

    return jax.vmap(day_episode)(jnp.arange(params.num_steps.shape[0]))


def day_metrics(out: dict, tick_size: float) -> dict:
    """Per-day figures from ``play_days`` output (NumPy, leading axes kept)."""
    active = np.asarray(out["active"])
    wealth = np.asarray(out["wealth"]) * active
    last = active.sum(-1) - 1
    final = np.take_along_axis(wealth, last[..., None], -1)[..., 0] * tick_size
    steps = np.maximum(active.sum(-1), 1)
    return {
        "pnl": final,
        "map": (np.abs(np.asarray(out["inventory"])) * active).sum(-1) / steps,
        "fills": (np.asarray(out["fills"]) * active).sum(-1),
        "market_orders": (np.asarray(out["market"]) * active).sum(-1),
        "decisions": steps,
    }


def summary(per_day: dict) -> dict:
    """Over test days (last axis): the table's figures."""
    pnl = per_day["pnl"]
    mean, std = pnl.mean(-1), pnl.std(-1)
    downside = np.sqrt(np.mean(np.minimum(pnl, 0.0) ** 2, -1))
    equity = np.cumsum(pnl, -1)
    drawdown = (np.maximum.accumulate(np.maximum(equity, 0.0), -1) - equity).max(-1)
    mean_map = per_day["map"].mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):  # no variation / no losing day: inf (or nan for 0 / 0)
        sharpe, sortino = mean / std, mean / downside
    return {"daily_pnl": mean, "sharpe": sharpe, "sortino": sortino,
            "max_drawdown": drawdown, "map": mean_map, "pnl_to_map": pnl.sum(-1) / np.maximum(mean_map, 1e-9),
            "fill_rate": per_day["fills"].sum(-1) / per_day["decisions"].sum(-1), "trades": per_day["fills"].sum(-1)}


def calibrate(days: list[data_lib.BookDay]) -> dict:
    """sigma (ticks per sqrt(s)) of the mid, and A, k of ``A exp(-k depth)``: market orders per side and second
    reaching ``depth`` ticks from the mid, as the closed forms define their fill intensity.

    Trade records are per price level, so one order sweeping three levels leaves three; each side's records
    within one second count as one order, at their deepest reach (several orders on a side in one second are
    then one, which makes the fitted rate at most 1 per second and side).
    """
    squares, seconds, reaches = 0.0, 0.0, []
    for day in days:
        mid = day.mid()
        squares += float(np.sum(np.diff(mid) ** 2))
        seconds += float(day.timestamps[-1] - day.timestamps[0])
        before = np.clip(np.searchsorted(day.timestamps, day.trade_times) - 1, 0, None)
        depth = np.abs(day.trade_prices - mid[before])
        second = np.floor(day.trade_times - day.timestamps[0]).astype(np.int64)
        orders, order_of_record = np.unique(np.stack([day.trade_sides, second]), axis=1, return_inverse=True)
        deepest = np.zeros(orders.shape[1])
        np.maximum.at(deepest, order_of_record.ravel(), depth)
        reaches.append(deepest)
    reaches = np.concatenate(reaches)
    grid = np.arange(0.5, 6.0, 1.0)
    rate = np.array([(reaches >= d).sum() for d in grid]) / (2 * seconds)
    ok = rate > 0
    if ok.sum() < 2:
        raise data_lib.DataError(f"{', '.join(day.name for day in days)}: too few trades to fit the fill intensity "
                                 f"(market orders reached {ok.sum()} of the depths {grid.tolist()} ticks)")
    slope, intercept = np.polyfit(grid[ok], np.log(rate[ok]), 1)
    return {"sigma": float(np.sqrt(squares / seconds)), "A": float(np.exp(intercept)), "k": float(-slope)}


def closed_form_chooser(kind: str, gamma: float, fit: dict, params: book.BookParams, horizons: jnp.ndarray):
    """``choose(obs, state)``: AS or GLFT depths (ticks) mapped to the nearest of the 15 level pairs."""
    pairs = jnp.asarray(book.LEVEL_PAIRS) - 1
    sigma, k, a = fit["sigma"], fit["k"], fit["A"]

    def choose(obs, state):
        d, s = state.day, state.step
        mid, q = params.mid[d, s], state.inventory / params.order_size
        if kind == "as":
            tau = jnp.maximum(horizons[d] - params.elapsed[d, s], 0.0)  # decisions need not be evenly spaced
            bid_depth, ask_depth = baselines.avellaneda_stoikov_depths(gamma, sigma, k, tau, q)
        else:
            bid_depth, ask_depth = baselines.gueant_lehalle_tapia_depths(gamma, sigma, k, a, q)
        level_bid = mid - params.bid_prices[d, s]
        level_ask = params.ask_prices[d, s] - mid
        cost = jnp.abs(level_bid[pairs[:, 0]] - bid_depth) + jnp.abs(level_ask[pairs[:, 1]] - ask_depth)
        return jnp.argmin(cost) + 1

    return choose


def reproduce(out: Path, quick: bool, skip_training: bool) -> Path:
    if skip_training:
        raise SystemExit("--skip-training: mm_event_vs_time keeps no trained agents to evaluate again; it trains "
                         "them each time")
    started = time.time()
    days = load_days(out, quick)
    train_count = 2 if quick else TRAIN_DAYS
    seeds = 2 if quick else SEEDS
    train_select, test_select = range(train_count), range(train_count, len(days))
    fit = calibrate(days[:train_count])
    rows, paths, daily = {}, {}, {}
    for stepping, options in STEPPINGS.items():
        train_params = book.build_params(days, stepping, select=train_select, **options)
        test_params = book.build_params(days, stepping, select=test_select, **options)
        env = book.BookEnv(train_params, window=WINDOW)
        tick = float(test_params.tick_size)
        choosers = baseline_choosers(fit, train_params, test_params, env, day_lengths(days, train_select),
                                     day_lengths(days, test_select))
        for label, choose in choosers.items():
            played, per_day = play_and_measure(env, test_params, choose)
            key = (label, "—", stepping)
            rows[key], daily[key], paths[key] = summary(per_day), per_day, first_day_inventory(played)
        for agent_name in ("ppo", "a2c"):
            module, config = agent_setup(agent_name, quick)
            print(f"[mm_event_vs_time] training {agent_name}, {stepping}-based: 7 rewards x {seeds} seeds", flush=True)
            policies = train_all(module, config, env, train_params, jax.random.PRNGKey(0), seeds)
            agent = module.make(config, env, test_params)

            def play(policy):
                return play_days(env, test_params, lambda obs, state: agent.act(policy, obs, jax.random.PRNGKey(0), True))

            played = jax.jit(jax.vmap(play))(policies)
            per_day = day_metrics(played, tick)  # [7 * seeds, days]
            for r, name in enumerate(rewards.REWARDS):
                block = {k: v[r * seeds : (r + 1) * seeds] for k, v in per_day.items()}
                key = (agent_name.upper(), name, stepping)
                rows[key], daily[key] = summary(block), block  # per seed
                paths[key] = first_day_inventory(jax.tree.map(lambda x, i=r * seeds: x[i], played))
    per_day_rows = {key: np.atleast_2d(table["pnl"]).mean(0) for key, table in daily.items()}  # mean over seeds
    results = out / ("results_quick.md" if quick else "results.md")
    results.write_text(render(rows, per_day_rows, fit, days, train_count, seeds, quick, time.time() - started))
    as_lists = lambda table: {m: np.asarray(v).tolist() for m, v in table.items()}  # noqa: E731
    (out / ("results_quick.json" if quick else "results.json")).write_text(json.dumps(
        {"test_days": [d.name for d in days[train_count:]],
         "summary": {" | ".join(k): as_lists(row) for k, row in rows.items()},
         "per_test_day": {" | ".join(k): as_lists(table) for k, table in daily.items()}}, indent=1))
    plot_equity(out / ("equity_quick.png" if quick else "equity.png"), rows, per_day_rows)
    plot_inventory(out / ("inventory_quick.png" if quick else "inventory.png"), rows, paths)
    print(results.read_text())
    return results


def day_lengths(days: list[data_lib.BookDay], select) -> jnp.ndarray:
    """Seconds from first to last snapshot of each selected day (the closed forms' horizon)."""
    return jnp.asarray([days[d].timestamps[-1] - days[d].timestamps[0] for d in select])


def play_and_measure(env, params, choose) -> tuple[dict, dict]:
    """``play_days`` in one compiled program, and its per-day metrics."""
    played = jax.jit(lambda: play_days(env, params, choose))()
    return played, day_metrics(played, float(params.tick_size))


def baseline_choosers(fit, train_params, test_params, env, train_lengths, test_lengths) -> dict:
    """Closed-form and trivial baselines; gamma of AS and GLFT chosen by training-day PnL."""
    choosers = {
        "do nothing": lambda obs, state: jnp.int32(book.DO_NOTHING),
        "fixed quotes, levels (1, 1)": lambda obs, state: jnp.int32(book.LEVEL_PAIRS.index((1, 1)) + 1),
        "fixed quotes, levels (5, 5)": lambda obs, state: jnp.int32(book.LEVEL_PAIRS.index((5, 5)) + 1),
    }
    for kind, label in (("as", "Avellaneda-Stoikov"), ("glft", "Gueant-Lehalle-Fernandez-Tapia")):
        scores = [play_and_measure(env, train_params, closed_form_chooser(kind, gamma, fit, train_params,
                                                                          train_lengths))[1]["pnl"].mean()
                  for gamma in GAMMAS]
        gamma = GAMMAS[int(np.argmax(scores))]
        choosers[f"{label} (gamma {gamma:g}, fitted)"] = closed_form_chooser(kind, gamma, fit, test_params,
                                                                             test_lengths)
    return choosers


def welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Difference of means ``a - b`` and the half-width of its 95% Welch t-interval."""
    from scipy import stats

    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    dof = (va + vb) ** 2 / max(va**2 / (len(a) - 1) + vb**2 / (len(b) - 1), 1e-12)
    return float(a.mean() - b.mean()), float(stats.t.ppf(0.975, max(dof, 1.0)) * np.sqrt(va + vb))


def holm_count(p_values, alpha: float = 0.05) -> int:
    """How many of the hypotheses stay rejected at family-wise level ``alpha`` after Holm's step-down
    correction: the k-th smallest p-value is held to ``alpha / (m - k)``, and the first to fail stops it."""
    ordered = np.sort(np.asarray(p_values, np.float64))
    passed = ordered <= alpha / (len(ordered) - np.arange(len(ordered)))
    return int(np.argmin(passed)) if not passed.all() else len(ordered)


def comparisons_note(differences, p_values) -> str:
    """What the per-pair verdicts are worth together: each is a separate 95% test, so the line also gives
    how many survive Holm's correction for all of them, and a two-sided sign test of the direction."""
    from scipy import stats

    differences = np.asarray(differences, np.float64)
    favour = int(np.sum(differences > 0))
    sign = stats.binomtest(favour, len(differences)).pvalue
    return (f"Each verdict is its own 95% Welch test; corrected for all {len(differences)} (Holm, 5%), "
            f"{holm_count(p_values)} pair(s) stay significant. Event-based is ahead in {favour} of "
            f"{len(differences)} pairs (two-sided sign test p = {sign:.2g}).")


def render(rows, per_day_rows, fit, days, train_count, seeds, quick, seconds) -> str:
    from scipy import stats

    test_names = [d.name for d in days[train_count:]]
    lines = ["# Market making: event-based versus time-based stepping", ""]
    if quick:
        lines += ["QUICK smoke test (tiny budgets, 4 short days): these numbers mean nothing.", ""]
    lines += [
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python -m rlx.reproduce mm_event_vs_time"
        f"{' --quick' if quick else ''}` in {seconds / 60:.0f} min. {train_count} training days, {len(test_names)} test "
        f"days ({days[0].name.rsplit('_', 2)[0] if days[0].name.startswith('synthetic') else 'loaded data'}), "
        f"{seeds} seeds per agent and reward; time-based = a decision every {STEPPINGS['time']['interval']:g} s, "
        f"event-based = every {STEPPINGS['event']['threshold_bps']:g} bps mid move. Fitted on the training days: "
        f"sigma {fit['sigma']:.3f} ticks/sqrt(s), A {fit['A']:.3f}/s, k {fit['k']:.3f}/tick.", "",
        "Learned rows: mean over seeds (± half-width of the 95% t-interval over seeds for the daily PnL). PnL in "
        "currency for one-unit orders; Sharpe and Sortino of daily PnL (not annualised); drawdown of the cumulative "
        "PnL over the test days; MAP = mean absolute position; fill rate = fills per decision.", "",
        "| agent | reward | stepping | daily PnL | Sharpe | Sortino | max drawdown | MAP | PnL / MAP | fill rate | "
        "fills |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (agent, reward_name, stepping), row in rows.items():
        pnl = np.atleast_1d(row["daily_pnl"])
        interval = f" ± {t_interval(pnl):.2f}" if pnl.size > 1 else ""
        cells = [f"{pnl.mean():.2f}{interval}"] + [f"{np.mean(row[m]):.2f}" for m in
                                                   ("sharpe", "sortino", "max_drawdown", "map", "pnl_to_map")]
        cells += [f"{np.mean(row['fill_rate']):.3f}", f"{np.mean(row['trades']):.0f}"]
        lines.append(f"| {agent} | {reward_name} | {stepping} | " + " | ".join(cells) + " |")
    lines += ["", "## Event minus time (mean daily PnL; 95% Welch interval over seeds)", "",
              "| agent | reward | event | time | difference | verdict |", "|---|---|---:|---:|---:|---|"]
    verdicts, differences, p_values = [], [], []
    for agent in ("PPO", "A2C"):
        for reward_name in rewards.REWARDS:
            event, timed = rows.get((agent, reward_name, "event")), rows.get((agent, reward_name, "time"))
            if event is None or timed is None:
                continue
            diff, half = welch(np.asarray(event["daily_pnl"]), np.asarray(timed["daily_pnl"]))
            verdict = "event better" if diff - half > 0 else ("time better" if diff + half < 0 else "no difference")
            verdicts.append(verdict)
            differences.append(diff)
            p_values.append(stats.ttest_ind(event["daily_pnl"], timed["daily_pnl"], equal_var=False).pvalue)
            lines.append(f"| {agent} | {reward_name} | {np.mean(event['daily_pnl']):.2f} | "
                         f"{np.mean(timed['daily_pnl']):.2f} | {diff:+.2f} ± {half:.2f} | {verdict} |")
    counts = {v: verdicts.count(v) for v in ("event better", "time better", "no difference")}
    lines += ["", f"Of {len(verdicts)} agent x reward pairs: event-based better in {counts['event better']}, "
              f"time-based better in {counts['time better']}, no significant difference in {counts['no difference']}."]
    lines += ([comparisons_note(differences, p_values), ""] if len(differences) > 1 else [""])
    lines += ["## PnL per test day (learned rows: mean over seeds)", "",
              "| agent | reward | stepping | " + " | ".join(f"d{i + 1}" for i in range(len(test_names))) + " |",
              "|---|---|---|" + "---:|" * len(test_names)]
    for (agent, reward_name, stepping), pnl in per_day_rows.items():
        lines.append(f"| {agent} | {reward_name} | {stepping} | " + " | ".join(f"{v:.1f}" for v in np.ravel(pnl)) + " |")
    suffix = "_quick" if quick else ""
    lines += ["", "Test days: " + ", ".join(test_names) + f". Per test day and seed, PnL, MAP, fills, market orders and "
              f"decisions are in `results{suffix}.json` (`per_test_day`).", "", f"![equity](equity{suffix}.png)", "",
              f"![inventory](inventory{suffix}.png)", ""]
    return "\n".join(lines)


def first_day_inventory(out) -> np.ndarray:
    """Inventory after each decision of the first test day (NaN after the day ends)."""
    return np.where(np.asarray(out["active"])[0], np.asarray(out["inventory"])[0], np.nan)


def best_learned(keys, rows, agent: str, stepping: str):
    """The reward with the highest mean daily PnL for ``agent`` and ``stepping``, or None if not trained."""
    learned = [k for k in keys if k[0] == agent and k[2] == stepping]
    return max(learned, key=lambda k: np.mean(rows[k]["daily_pnl"])) if learned else None


def plot_per_stepping(path: Path, title: str, xlabel: str, ylabel: str, draw) -> None:
    """One panel per stepping mode, side by side; ``draw(axis, stepping)`` adds the lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for axis, stepping in zip(axes, STEPPINGS):
        draw(axis, stepping)
        axis.set_title(f"{stepping}-based: {title}")
        axis.set_xlabel(xlabel)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=6)
    axes[0].set_ylabel(ylabel)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_inventory(path: Path, rows, paths) -> None:
    """Inventory on the first test day: the best PPO and A2C configuration (seed 0) and the baselines that quote."""

    def draw(axis, stepping):
        for agent in ("PPO", "A2C"):
            best = best_learned(paths, rows, agent, stepping)
            if best:
                axis.plot(paths[best], lw=1.5, label=f"{agent}, {best[1]} (seed 0)")
        for key, inventory in paths.items():
            if key[1] == "—" and key[2] == stepping and not key[0].startswith("do nothing"):
                axis.plot(inventory, lw=0.8, alpha=0.7, label=key[0])

    plot_per_stepping(path, "inventory on the first test day", "decision", "inventory (units)", draw)


def plot_equity(path: Path, rows, per_day_rows) -> None:
    """Cumulative PnL over the test days: the best PPO and A2C configuration (mean over seeds) and the baselines."""

    def draw(axis, stepping):
        for agent in ("PPO", "A2C"):
            best = best_learned(per_day_rows, rows, agent, stepping)
            if best:
                pnl = per_day_rows[best]
                axis.plot(np.arange(1, len(pnl) + 1), np.cumsum(pnl), lw=2, label=f"{agent}, {best[1]}")
        for key, pnl in per_day_rows.items():
            if key[1] == "—" and key[2] == stepping:
                axis.plot(np.arange(1, len(pnl) + 1), np.cumsum(pnl), "--", lw=1, label=key[0])

    plot_per_stepping(path, "cumulative PnL over test days", "test day", "cumulative PnL (currency, one-unit orders)",
                      draw)
