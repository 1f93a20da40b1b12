"""The model-based market-making environment and its closed-form baselines.

References: the Avellaneda-Stoikov simulation as published re-runs report it,
hand-computed quote formulas, the Cartea-Jaimungal value against Monte Carlo,
and moments of the price and arrival processes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.envs import registry
from rlx.envs.market import baselines
from rlx.envs.market.quoting import QuotingParams, QuotingState
from rlx.errors import ConfigError

# Published re-runs of the Avellaneda-Stoikov simulation (1000 paths): gamma -> (mean spread, PnL mean, PnL std, q_T std).
AVELLANEDA_STOIKOV_RERUNS = {0.1: (1.49, 64.87, 6.69, 2.89), 0.01: (1.35, 68.75, 8.72, 5.10)}
PUBLISHED_PATHS = 1000
CJ_PENALTIES = dict(inventory_penalty=2.0, terminal_penalty=2.0, max_inventory=10.0)


def make(**params):
    env, default = registry.make("market_quoting")
    return env, env.check_params(default.replace(**params))


def state_at(time, inventory, mid=100.0):
    return QuotingState(mid=jnp.float32(mid), inventory=jnp.float32(inventory), cash=jnp.float32(0.0),
                        excitation=jnp.zeros(2), time=time)


@pytest.mark.parametrize("gamma", sorted(AVELLANEDA_STOIKOV_RERUNS))
def test_avellaneda_stoikov_simulation_matches_published_reruns(gamma, optimised):
    spread, pnl_mean, pnl_std, inventory_std = AVELLANEDA_STOIKOV_RERUNS[gamma]
    env, params = make()
    paths = 20_000
    result = baselines.simulate(env, params, baselines.avellaneda_stoikov(gamma), jax.random.PRNGKey(7), paths)
    pnl, inventory = np.asarray(result["pnl"]), np.asarray(result["terminal_inventory"])
    assert float(result["mean_spread"].mean()) == pytest.approx(spread, abs=0.005)
    # Difference of two sample means / standard deviations, each with its own sampling error; 3.5 sigma.
    mean_error = np.sqrt(pnl_std**2 / PUBLISHED_PATHS + pnl.var() / paths)
    assert abs(pnl.mean() - pnl_mean) < 3.5 * mean_error
    std_error = lambda s: np.sqrt(s**2 / (2 * PUBLISHED_PATHS) + s**2 / (2 * paths))  # noqa: E731
    assert abs(pnl.std() - pnl_std) < 3.5 * std_error(pnl_std)
    assert abs(inventory.std() - inventory_std) < 3.5 * std_error(inventory_std)


def test_avellaneda_stoikov_quotes_by_hand():
    env, params = make()
    bid, ask = baselines.avellaneda_stoikov(0.1)(state_at(100, 2.0), params)
    tau = 0.5
    half = 0.5 * 0.1 * 4.0 * tau + np.log(1 + 0.1 / 1.5) / 0.1
    skew = 2.0 * 0.1 * 4.0 * tau
    np.testing.assert_allclose([bid, ask], [half + skew, half - skew], rtol=1e-5)


def test_gueant_lehalle_tapia_quotes_by_hand():
    env, params = make()
    gamma, k, a, sigma = 0.1, 1.5, 140.0, 2.0
    c1 = np.log(1 + gamma / k) / gamma
    c2 = np.sqrt(sigma**2 * gamma / (2 * k * a) * (1 + gamma / k) ** (1 + k / gamma))
    for q in (-3.0, 0.0, 2.0):
        bid, ask = baselines.gueant_lehalle_tapia(gamma)(state_at(0, q), params)
        np.testing.assert_allclose([bid, ask], [c1 + (2 * q + 1) / 2 * c2, c1 - (2 * q - 1) / 2 * c2], rtol=1e-5)


def test_cartea_jaimungal_value_matches_monte_carlo_in_fine_time(optimised):
    """With dt small (2000 steps) the environment approaches the continuous model the matrix exponential solves."""
    env, params = make(max_steps_in_episode=2000, **CJ_PENALTIES)
    result = baselines.simulate(env, params, baselines.cartea_jaimungal(params), jax.random.PRNGKey(3), 4000)
    returns = np.asarray(result["return"])
    value = baselines.cartea_jaimungal_value(params)
    assert abs(returns.mean() - value) < 0.01 * value + 3 * returns.std() / np.sqrt(len(returns))


def test_cartea_jaimungal_depths_are_symmetric_and_skewed():
    _, params = make(**CJ_PENALTIES)
    depths = baselines.cartea_jaimungal_depths(params)
    limit = 10
    for q in range(-5, 6):
        assert depths[100, limit + q, 0] == pytest.approx(depths[100, limit - q, 1], abs=1e-6)
    bids = depths[100, limit - 3 : limit + 4, 0]
    assert np.all(np.diff(bids) > 0), "a longer inventory must quote a deeper bid"
    # Without penalties and far from the limits the optimum is the monopolist depth 1/k.
    _, free = make(max_inventory=30.0)
    assert baselines.cartea_jaimungal_depths(free)[0, 30, 0] == pytest.approx(1 / 1.5, abs=1e-3)


def test_cartea_jaimungal_beats_every_other_baseline_on_its_objective(optimised):
    env, params = make(**CJ_PENALTIES)
    policies = {
        "cj": baselines.cartea_jaimungal(params),
        "as": baselines.avellaneda_stoikov(0.1),
        "glft": baselines.gueant_lehalle_tapia(0.1),
        "fixed": baselines.fixed_spread(1 / 1.5),
    }
    means = {name: float(baselines.simulate(env, params, p, jax.random.PRNGKey(1), 4000)["return"].mean())
             for name, p in policies.items()}
    assert means["cj"] == max(means.values()), means
    assert means["fixed"] < 0 < means["glft"], means


def test_cartea_jaimungal_table_underflow_names_the_field():
    _, params = make(inventory_penalty=2.0, terminal_penalty=2.0, max_inventory=20.0)  # underflows from |q| = 16
    with pytest.raises(ConfigError, match="max_inventory"):
        baselines.cartea_jaimungal_value(params)


def test_cartea_jaimungal_table_stays_finite_over_long_horizons():
    """exp(G T) overflows near T = 7 at these rates; the value must instead grow linearly once T is long (the
    stationary rate of the largest eigenvalue), with finite depths everywhere."""
    values = []
    for horizon in (10.0, 20.0, 30.0):
        params = QuotingParams(horizon=horizon, max_steps_in_episode=10, **CJ_PENALTIES)  # a coarse grid: the
        # table alone (the environment would refuse dt this long for its arrivals)
        assert np.isfinite(baselines.cartea_jaimungal_depths(params)).all()
        values.append(baselines.cartea_jaimungal_value(params))
    assert values[2] - values[1] == pytest.approx(values[1] - values[0], rel=1e-6)
    assert values[1] > values[0] > 0


def test_event_rates_beyond_one_per_step_are_refused():
    """One Bernoulli draw a step: a Hawkes market whose stationary rate exceeds 1 / dt would lose arrivals."""
    with pytest.raises(ConfigError, match=r"stationary Hawkes mean\) \* dt must be <= 1.*at least 281 steps"):
        make(arrival_process="hawkes", hawkes_jump=50.0, hawkes_decay=100.0)  # 140 * 100 / 50 = 280 a unit time
    make(arrival_process="hawkes", hawkes_jump=50.0, hawkes_decay=100.0, max_steps_in_episode=281)
    with pytest.raises(ConfigError, match="hawkes_jump: 100.0 must be >= 0 and below hawkes_decay"):
        make(arrival_process="hawkes", hawkes_jump=100.0, hawkes_decay=100.0, max_steps_in_episode=100_000)
    with pytest.raises(ConfigError, match="jump_rate \\* dt must be <= 1"):
        make(price_process="jump", jump_rate=500.0)


def rollout(env, params, depths, steps, paths, key=0):
    """Final states and per-step infos of a constant-depth policy (no auto-reset)."""
    action = jnp.asarray(depths, jnp.float32)

    def path(path_key):
        _, state = env.reset_env(path_key, params)

        def step(state, k):
            _, state, reward, _, info = env.step_env(k, state, action, params)
            return state, (reward, info)

        return jax.lax.scan(step, state, jax.random.split(jax.random.fold_in(path_key, 1), steps))

    return jax.jit(jax.vmap(path))(jax.random.split(jax.random.PRNGKey(key), paths))


def test_fill_frequency_and_wealth_accounting():
    env, params = make(max_steps_in_episode=200)
    state, (rewards, info) = rollout(env, params, [0.5, 1.0], 200, 2000)
    probability = 140 * 0.005 * np.exp(-1.5 * np.array([0.5, 1.0]))
    for side, p in zip(("bid_fill", "ask_fill"), probability):
        rate = float(info[side].mean())
        assert abs(rate - p) < 4 * np.sqrt(p * (1 - p) / info[side].size)
    # No penalties: the summed rewards are the final marked-to-market wealth, and that is the cash of
    # buying at the mid before each step less the bid depth and selling at it plus the ask depth, plus the
    # inventory at the last mid.
    mid_before = np.concatenate([np.full((rewards.shape[0], 1), float(params.s0)), info["mid"][:, :-1]], axis=1)
    cash = (-info["bid_fill"] * (mid_before - 0.5) + info["ask_fill"] * (mid_before + 1.0)).sum(1)
    inventory = (info["bid_fill"] - info["ask_fill"]).sum(1)
    np.testing.assert_allclose(info["inventory"][:, -1], inventory)
    np.testing.assert_allclose(rewards.sum(1), cash + inventory * info["mid"][:, -1], rtol=1e-4, atol=5e-2)


def test_inventory_never_passes_its_limit():
    env, params = make(max_inventory=3.0)
    _, (_, info) = rollout(env, params, [0.0, 3.0], 200, 256)  # buys far more often than it sells
    assert float(info["inventory"].max()) == 3.0
    assert float(info["inventory"].min()) >= -3.0


def test_penalties_enter_the_reward():
    env, params = make(inventory_penalty=1.0, terminal_penalty=0.5, max_steps_in_episode=200)
    state, (rewards, info) = rollout(env, params, [0.0, 3.0], 200, 64)
    inventory_before = np.concatenate([np.zeros((64, 1)), np.asarray(info["inventory"][:, :-1])], axis=1)
    wealth = np.asarray(state.cash + state.inventory * state.mid)
    expected = wealth - (inventory_before**2).sum(1) * 0.005 - 0.5 * np.asarray(state.inventory) ** 2
    np.testing.assert_allclose(rewards.sum(1), expected, rtol=1e-4, atol=0.05)


def test_ornstein_uhlenbeck_mid_has_its_stationary_moments(optimised):
    theta, sigma = 5.0, 2.0
    env, params = make(price_process="ou", ou_rate=theta, sigma=sigma, max_steps_in_episode=1000)
    state, _ = rollout(env, params, [10.0, 10.0], 1000, 4000)
    mids = np.asarray(state.mid)
    variance = sigma**2 / (2 * theta) * (1 - np.exp(-2 * theta))
    assert abs(mids.mean() - 100.0) < 4 * np.sqrt(variance / len(mids))
    assert mids.var() == pytest.approx(variance, rel=0.1)


def test_jumps_add_their_variance(optimised):
    env, params = make(price_process="jump", jump_rate=20.0, jump_std=1.0, sigma=1.0, max_steps_in_episode=1000)
    state, _ = rollout(env, params, [10.0, 10.0], 1000, 4000)
    assert np.asarray(state.mid).var() == pytest.approx(1.0 + 20.0 * 1.0, rel=0.1)


def test_hawkes_arrivals_excite_themselves(optimised):
    """Depth 0 fills every arrival; E[arrivals] = A T + int_0^T alpha A / (beta - alpha) (1 - e^-(beta - alpha) t) dt."""
    a, alpha, beta = 140.0, 50.0, 100.0
    env, params = make(arrival_process="hawkes", hawkes_jump=alpha, hawkes_decay=beta,
                       max_steps_in_episode=4000, max_inventory=1e6)
    _, (_, info) = rollout(env, params, [0.0, 0.0], 4000, 500)
    rate = beta - alpha
    expected = a + alpha * a / rate * (1 - (1 - np.exp(-rate)) / rate)
    assert float(info["bid_fill"].sum(1).mean()) == pytest.approx(expected, rel=0.03)
    _, poisson = make(max_steps_in_episode=4000, max_inventory=1e6)
    _, (_, plain) = rollout(env, poisson, [0.0, 0.0], 4000, 500)
    assert float(plain["bid_fill"].sum(1).mean()) == pytest.approx(a, rel=0.03)


def test_discrete_actions_index_the_depth_grid():
    env, params = registry.make("market_quoting", {"actions": "discrete", "depth_levels": 5})
    assert env.action_space(params).n == 25
    np.testing.assert_allclose(env.depths(jnp.int32(7), params), [1.0, 2.0])  # grid 0, 1, 2, 3, 4
    assert int(baselines.nearest_grid_action(env, params, jnp.array([1.1, 2.9]))) == 1 * 5 + 3


def test_parameters_vmap_in_one_program():
    env, params = make()
    sigmas = jnp.array([0.5, 4.0])
    batched = jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (2,)), params).replace(sigma=sigmas)

    def final_mid_spread(p):
        keys = jax.random.split(jax.random.PRNGKey(0), 512)
        _, state = jax.vmap(env.reset, in_axes=(0, None))(keys, p)
        step = jax.vmap(env.step, in_axes=(0, 0, None, None))
        _, state, *_ = step(keys, state, jnp.array([1.0, 1.0]), p)
        return state.mid.std()

    spreads = jax.jit(jax.vmap(final_mid_spread))(batched)
    np.testing.assert_allclose(spreads, sigmas * np.sqrt(0.005), rtol=0.15)


@pytest.mark.parametrize(
    "overrides, field",
    [({"price_process": "levy"}, "price_process"), ({"sigma": 0.0}, "sigma"),
     ({"max_steps_in_episode": 100}, "max_steps_in_episode"), ({"arrival_process": 7}, "arrival_process")],
)
def test_bad_parameters_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=f"env.params.{field}"):
        registry.make("market_quoting", **overrides)


def test_unknown_action_kind_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="continuous, discrete"):
        registry.make("market_quoting", {"actions": "grid"})


def test_paired_ratio_of_proportional_paths_is_exact():
    from rlx.envs.market.quoting_study import paired_ratio

    optimum = np.random.default_rng(0).normal(60, 6, 1000)
    ratio, half_width = paired_ratio(0.9 * optimum, optimum)
    assert ratio == pytest.approx(0.9) and half_width == pytest.approx(0.0, abs=1e-9)
    ratio, half_width = paired_ratio(optimum + np.random.default_rng(1).normal(0, 6, 1000), optimum)
    assert abs(ratio - 1) < 3 * half_width / 1.96 and half_width > 0


@pytest.mark.slow
def test_ppo_preset_reaches_95_percent_of_the_optimum(run_cli, tmp_path):
    """The experiments/mm_quoting claim on two seeds: PPO's greedy value >= 0.95 of Cartea-Jaimungal's, same paths."""
    from rlx.envs.market.quoting_study import learned_policy, paired_ratio
    from rlx.runner.components import load_trained

    done = run_cli("+exp=ppo_market_quoting", "logger=none", "run.num_seeds=2", timeout=600)
    assert done.returncode == 0, done.stderr
    run = load_trained(tmp_path / "run")
    env, params = run.parts.env, run.parts.env_params
    key = jax.random.PRNGKey(5)
    optimum = baselines.simulate(env, params, baselines.cartea_jaimungal(params), key, 4000)["return"]
    for seed in range(2):
        learned = baselines.simulate(env, params, learned_policy(run, seed), key, 4000)["return"]
        ratio, _ = paired_ratio(np.asarray(learned), np.asarray(optimum))
        assert ratio >= 0.95, (seed, ratio)
