"""PPO against the Cartea-Jaimungal optimum: ``python -m rlx.reproduce mm_quoting [--quick] [--skip-training]``.

Trains ``+exp=ppo_market_quoting`` (4 seeds), then scores every quoting policy
on the same environment and the same random paths (common random numbers: the
price path and the uniform draws deciding fills are shared, so differences
between rows are differences of policy): PPO's greedy policy per seed, the
Cartea-Jaimungal optimum, Avellaneda-Stoikov and Gueant-Lehalle-Fernandez-Tapia
at the Avellaneda-Stoikov paper's risk aversions, a fixed spread at the
monopolist depth 1/k, and quoting so deep that nothing fills. Writes
``results.md``, ``results.json`` and ``depths.png`` (PPO's depths at t = T/2
for inventories -3..3 against the optimum's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np

from rlx.envs.market import baselines
from rlx.errors import ConfigError

PRESET = "ppo_market_quoting"
TARGET = 0.95
PLOT_INVENTORIES = np.arange(-3, 4)


def check_finished(run_dir: Path) -> dict:
    """The summary of the run in ``run_dir``; a one-line error, before any scoring, unless that run trained to
    its end (an interrupted one has no ``summary.json``; a diverged one says so in it)."""
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise ConfigError(f"run_dir={run_dir}: no finished run there (no summary.json); train it without "
                          "--skip-training")
    summary = json.loads(summary_path.read_text())
    if summary.get("status") not in ("completed", "reached_stop_at_return"):
        raise ConfigError(f"run_dir={run_dir}: its run did not finish (status {summary.get('status')}); train it "
                          "without --skip-training")
    return summary


def reproduce(out: Path, quick: bool, skip_training: bool) -> Path:
    from rlx.reproduce import train_preset
    from rlx.runner.components import load_trained

    suffix = "_quick" if quick else ""
    run_dir = out / "runs" / f"{PRESET}{suffix}"
    if not skip_training:
        train_preset(PRESET, run_dir, 2 if quick else 4, ("algo.total_timesteps=65536",) if quick else ())
    trained = check_finished(run_dir)
    run = load_trained(run_dir)
    env, params = run.parts.env, run.parts.env_params
    paths = 1024 if quick else 20_000
    key = jax.random.PRNGKey(2026)
    started = time.time()

    def score(policy) -> dict:
        result = baselines.simulate(env, params, policy, key, paths)
        return {name: np.asarray(values, np.float64) for name, values in result.items()}

    learned = [learned_policy(run, seed) for seed in range(run.parts.settings.num_seeds)]
    per_seed = [score(policy) for policy in learned]
    rows = {f"PPO seed {seed}": summarize(result) for seed, result in enumerate(per_seed)}
    k = float(params.fill_decay)
    references = {
        "Cartea-Jaimungal optimum": baselines.cartea_jaimungal(params),
        "Avellaneda-Stoikov, gamma 0.1": baselines.avellaneda_stoikov(0.1),
        "Avellaneda-Stoikov, gamma 0.01": baselines.avellaneda_stoikov(0.01),
        "Gueant-Lehalle-Fernandez-Tapia, gamma 0.1": baselines.gueant_lehalle_tapia(0.1),
        "Gueant-Lehalle-Fernandez-Tapia, gamma 0.01": baselines.gueant_lehalle_tapia(0.01),
        f"fixed spread, depth 1/k = {1 / k:.3f}": baselines.fixed_spread(1 / k),
        f"no quotes (depth {float(params.max_depth):g}: almost never filled)": baselines.fixed_spread(float(params.max_depth)),
    }
    optimum = score(references["Cartea-Jaimungal optimum"])
    rows.update({label: summarize(score(policy)) for label, policy in references.items()})
    ppo_returns = np.array([result["return"].mean() for result in per_seed])
    # Paired (same paths) ratio of means per seed, with a 95% interval from the per-path differences.
    ratios = [paired_ratio(result["return"], optimum["return"]) for result in per_seed]
    summary = {
        "closed_form_value": baselines.cartea_jaimungal_value(params),
        "optimum_on_env": float(optimum["return"].mean()),
        "ppo_mean": float(ppo_returns.mean()),
        "ppo_ratio_per_seed": [r[0] for r in ratios],
        "ppo_ratio_ci95_per_seed": [r[1] for r in ratios],
        "ppo_ratio_mean": float(np.mean([r[0] for r in ratios])),
        "paths": paths,
        "env_steps_per_seed": trained["env_steps_per_seed"],
        "seconds": time.time() - started,
    }
    plot_depths(out / f"depths{suffix}.png", run, learned, params)
    results = out / f"results{suffix}.md"
    results.write_text(render(rows, summary, params, quick))
    (out / f"results{suffix}.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    print(results.read_text())
    return results


def learned_policy(run, seed: int):
    """``policy(state, params) -> depths`` from PPO's greedy action on the environment's observation."""
    agent, policy_params = run.agent(0), run.policy(0, seed)
    env = run.parts.env

    def policy(state, params):
        return agent.act(policy_params, env.get_obs(state, params), jax.random.PRNGKey(0), True)

    return policy


def summarize(result: dict) -> dict:
    returns = result["return"]
    return {
        "return": float(returns.mean()),
        "return_ci95": float(1.96 * returns.std() / np.sqrt(len(returns))),
        "pnl": float(result["pnl"].mean()),
        "pnl_std": float(result["pnl"].std()),
        "abs_terminal_inventory": float(np.abs(result["terminal_inventory"]).mean()),
        "fills": float(result["fills"].mean()),
        "mean_spread": float(result["mean_spread"].mean()),
    }


def paired_ratio(returns: np.ndarray, optimum: np.ndarray) -> tuple[float, float]:
    """``mean(returns) / mean(optimum)`` and the half-width of its 95% interval (delta method on paired paths)."""
    ratio = returns.mean() / optimum.mean()
    residual = returns - ratio * optimum
    return float(ratio), float(1.96 * residual.std() / np.sqrt(len(returns)) / abs(optimum.mean()))


def depths_at_half_time(policy, params) -> np.ndarray:
    """``[len(PLOT_INVENTORIES), 2]`` (bid, ask) depths of ``policy`` at t = T/2, mid at S0."""
    from rlx.envs.market.quoting import QuotingState

    half = int(params.max_steps_in_episode) // 2

    def at(q):
        state = QuotingState(mid=np.float32(params.s0), inventory=q, cash=np.float32(0),
                             excitation=np.zeros(2, np.float32), time=half)
        return policy(state, params)

    return np.asarray(jax.vmap(at)(PLOT_INVENTORIES.astype(np.float32)))


def plot_depths(path: Path, run, learned, params) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    optimum = depths_at_half_time(baselines.cartea_jaimungal(params), params)
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for side, (axis, name) in enumerate(zip(axes, ("bid", "ask"))):
        axis.plot(PLOT_INVENTORIES, optimum[:, side], "k-", lw=2, label="Cartea-Jaimungal optimum")
        for seed, policy in enumerate(learned):
            axis.plot(PLOT_INVENTORIES, depths_at_half_time(policy, params)[:, side], "o--", ms=4, alpha=0.8,
                      label=f"PPO seed {seed}")
        axis.set_title(f"{name} depth at t = T/2")
        axis.set_xlabel("inventory q")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("depth from mid")
    axes[1].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def render(rows: dict, summary: dict, params, quick: bool) -> str:
    lines = ["# PPO quoting against the Cartea-Jaimungal optimum", ""]
    if quick:
        lines += ["QUICK smoke test (tiny budget, 1024 paths): these numbers mean nothing.", ""]
    lines += [
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python -m rlx.reproduce mm_quoting"
        f"{' --quick' if quick else ''}`. Environment `market_quoting`: S0={float(params.s0):g}, "
        f"sigma={float(params.sigma):g}, T={float(params.horizon):g} in {int(params.max_steps_in_episode)} steps, "
        f"A={float(params.arrival_rate):g}, k={float(params.fill_decay):g}, inventory in "
        f"[-{float(params.max_inventory):g}, {float(params.max_inventory):g}], running penalty "
        f"phi={float(params.inventory_penalty):g}, terminal penalty alpha={float(params.terminal_penalty):g}. "
        f"PPO: {summary['env_steps_per_seed']:,} env steps per seed, greedy actions. Every row is scored on the "
        f"same {summary['paths']:,} paths.", "",
        "| policy | return (penalised PnL) ± 95% CI | PnL mean | PnL std | mean abs. terminal inventory | fills | "
        "mean spread |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, row in rows.items():
        lines.append(f"| {label} | {row['return']:.2f} ± {row['return_ci95']:.2f} | {row['pnl']:.2f} | "
                     f"{row['pnl_std']:.2f} | {row['abs_terminal_inventory']:.2f} | {row['fills']:.1f} | "
                     f"{row['mean_spread']:.3f} |")
    ratios = ", ".join(f"{r:.3f} ± {c:.3f}" for r, c in zip(summary["ppo_ratio_per_seed"],
                                                           summary["ppo_ratio_ci95_per_seed"]))
    verdict = "MET" if summary["ppo_ratio_mean"] >= TARGET else "MISSED"
    lines += [
        "", f"Closed-form value of the optimum (continuous time): {summary['closed_form_value']:.2f}; the same "
        f"policy on this discrete-time environment: {summary['optimum_on_env']:.2f}.", "",
        f"PPO / optimum on the same paths, per seed (95% CI): {ratios}.", "",
        f"- Target: PPO's value >= {TARGET:.0%} of the optimum's on the same environment: mean ratio "
        f"{summary['ppo_ratio_mean']:.3f}: {verdict}", "",
        "![depths](depths" + ("_quick" if quick else "") + ".png)", "",
    ]
    return "\n".join(lines)
