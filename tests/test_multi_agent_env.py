"""The multi-agent contract (rlx/envs/multi_agent.py) on Coop (rlx/envs/coop.py): auto-reset, flags, invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx.envs.coop import Coop, CoopState
from rlx.envs.multi_agent import MultiAgentEnv

SETTINGS = settings(deadline=None, max_examples=25, derandomize=True)


@functools.lru_cache(maxsize=None)
def jitted(num_agents=2, num_cards=3):
    env = Coop(num_agents, num_cards)
    return env, jax.jit(env.step), jax.jit(env.reset)


@functools.lru_cache(maxsize=None)
def views(num_agents, num_cards):
    """Jitted (action mask, observations) of a state: one compiled program per shape."""
    env = Coop(num_agents, num_cards)
    return jax.jit(lambda state, params: (env.action_mask(state, params), env.get_obs(state, params)))


def oracle_actions(env: Coop, state: CoopState):
    """Every agent names the team target (which scores unless it is that agent's disabled action)."""
    return jnp.full(env.num_agents, env.target(state))


def test_is_a_multi_agent_env_with_consistent_spaces():
    env = Coop(3, 4)
    params = env.default_params
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    assert isinstance(env, MultiAgentEnv) and env.num_agents == 3
    assert obs.shape == (3,) + env.observation_space(params).shape
    assert env.world_state(state, params).shape == env.world_state_space(params).shape
    assert env.action_mask(state, params).shape == (3, env.action_space(params).n) == (3, 4)
    assert env.alive(state, params).dtype == jnp.bool_ and env.alive(state, params).all()
    with pytest.raises(ValueError, match="num_agents=1"):
        Coop(1)


def test_truncation_auto_resets_and_keeps_the_final_observation():
    env, step, reset = jitted()
    params = env.default_params.replace(mask_prob=0.0)
    horizon = params.max_steps_in_episode
    obs, state = reset(jax.random.PRNGKey(0), params)
    for t in range(horizon):
        key = jax.random.PRNGKey(100 + t)
        obs, state, reward, terminated, truncated, info = step(key, state, oracle_actions(env, state), params)
        np.testing.assert_allclose(reward, 1.0)  # the oracle scores every step
        assert not terminated.any()
        last = t == horizon - 1
        assert truncated.shape == (2,) and bool(truncated.all()) == last and bool(truncated.any()) == last
        assert bool(info["episode_over"]) == last
    # After the last step: a fresh episode, drawn with the reset half of the step key.
    fresh_obs, fresh_state = env.reset_env(jax.random.split(key)[1], params)
    np.testing.assert_array_equal(obs, fresh_obs)
    assert int(state.time) == 0 and state.alive.all()
    np.testing.assert_array_equal(state.cards, fresh_state.cards)
    # info keeps the pre-reset observation and world state: time feature T/T = 1.
    np.testing.assert_allclose(info["final_observation"][:, -1], 1.0)
    np.testing.assert_allclose(info["final_world_state"][-1], 1.0)
    assert not np.array_equal(info["final_observation"], obs)


def test_episode_ends_when_every_agent_dies_and_not_before():
    env, step, reset = jitted(3, 3)
    params = env.default_params.replace(mask_prob=0.0)
    _, state = reset(jax.random.PRNGKey(1), params)
    # One agent dead: the episode goes on, the dead agent stays terminated, sees zeros, scores nothing.
    state = state.replace(alive=jnp.array([True, False, True]))
    obs, state2, reward, terminated, truncated, info = step(jax.random.PRNGKey(2), state, oracle_actions(env, state),
                                                            params)
    assert not info["episode_over"] and not truncated.any()
    np.testing.assert_array_equal(terminated, [False, True, False])
    np.testing.assert_array_equal(env.alive(state2, params), [True, False, True])
    np.testing.assert_allclose(obs[1], 0.0)
    assert np.abs(obs[0]).sum() > 0
    np.testing.assert_allclose(reward, 2 / 3)  # two alive agents scored, out of three
    # death_prob = 1: everybody dies on this step -> terminated everywhere, auto-reset, not truncated.
    doomed = params.replace(death_prob=1.0)
    obs, state3, reward, terminated, truncated, info = step(jax.random.PRNGKey(3), state2,
                                                            oracle_actions(env, state2), doomed)
    assert info["episode_over"] and terminated.all() and not truncated.any()
    np.testing.assert_allclose(reward, 2 / 3)  # rewards belong to the step, deaths come after
    np.testing.assert_allclose(info["final_observation"], 0.0)  # all dead before the reset
    np.testing.assert_array_equal(info["final_world_state"][9:12], 0.0)  # alive flags in the world state
    assert state3.alive.all() and int(state3.time) == 0 and np.abs(obs).sum() > 0


@SETTINGS
@given(seed=st.integers(0, 2**31 - 1), shape=st.sampled_from([(2, 2), (2, 3), (3, 3), (4, 5)]), data=st.data())
def test_reward_mask_and_observations_match_a_numpy_reference(seed, shape, data):
    n, k = shape
    env, step, reset = jitted(n, k)
    params = env.default_params.replace(death_prob=0.2, mask_prob=0.7)
    _, state = reset(jax.random.PRNGKey(seed), params)
    alive = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    actions = np.array(data.draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n)))
    state = state.replace(alive=jnp.asarray(alive))

    cards, disabled = np.asarray(state.cards), np.asarray(state.disabled)
    mask, obs = (np.asarray(x) for x in views(n, k)(state, params))
    # At most one disabled action per agent: the one in ``disabled`` (-1: none).
    assert mask.shape == (n, k) and (mask.sum(1) >= k - 1).all()
    for i in range(n):
        np.testing.assert_array_equal(mask[i], np.arange(k) != disabled[i])
    for i in range(n):
        if not alive[i]:
            np.testing.assert_array_equal(obs[i], 0.0)
            continue
        for j in range(n):  # block j of agent i is the card of agent i + j (mod n)
            np.testing.assert_array_equal(obs[i, j * k:(j + 1) * k], np.eye(k)[cards[(i + j) % n]])
    hidden = np.asarray(views(n, k)(state, params.replace(show_teammates=False))[1])
    np.testing.assert_array_equal(hidden[:, k:n * k], 0.0)
    np.testing.assert_array_equal(hidden[:, :k], obs[:, :k])

    target = cards.sum() % k
    scored = alive & mask[np.arange(n), actions] & (actions % k == target)
    _, next_state, reward, terminated, _, info = step(jax.random.PRNGKey(seed + 1), state, jnp.asarray(actions), params)
    np.testing.assert_allclose(reward, np.full(n, scored.sum() / n), rtol=1e-6)
    # Deaths are permanent within an episode; terminated is "not alive".
    if not info["episode_over"]:
        next_alive = np.asarray(next_state.alive)
        assert not (next_alive & ~alive).any()
        np.testing.assert_array_equal(np.asarray(terminated), ~next_alive)


COOP = Coop(2, 3)


def own_card(obs, mask, state, key):
    """A teammate-blind guess: "the target is my own card", or the next card when that one is disabled."""
    card = jnp.argmax(obs[:, :3], -1)
    return jnp.where(mask[jnp.arange(2), card], card, (card + 1) % 3)


def random_available(obs, mask, state, key):
    return jax.random.categorical(key, jnp.where(mask, 0.0, -1e9))


def mask_ignoring_oracle(obs, mask, state, key):
    return oracle_actions(COOP, state)


POLICIES = {"oracle": mask_ignoring_oracle, "own_card": own_card, "random": random_available}


@jax.jit
def episode_returns(keys, params):
    """Team returns of one episode per key under each policy; params are traced (one program for all)."""

    def run(policy, key):
        reset_key, key = jax.random.split(key)
        obs, state = COOP.reset(reset_key, params)

        def body(carry, key):
            obs, state, total, running = carry
            act_key, step_key = jax.random.split(key)
            actions = policy(obs, COOP.action_mask(state, params), state, act_key)
            obs, state, reward, _, _, info = COOP.step(step_key, state, actions, params)
            total = total + running * reward.mean()
            return (obs, state, total, running * (1.0 - info["episode_over"])), None

        carry = (obs, state, 0.0, 1.0)
        (_, _, total, _), _ = jax.lax.scan(body, carry, jax.random.split(key, COOP.default_params.max_steps_in_episode))
        return total

    return {name: jax.vmap(lambda k, f=f: run(f, k))(keys) for name, f in POLICIES.items()}


@pytest.mark.parametrize("death_prob", [0.0, 0.25])
def test_oracle_reaches_the_optimum_and_teammate_blind_policies_get_one_over_k(death_prob, optimised):
    params = COOP.default_params.replace(death_prob=death_prob)
    episodes = 4096
    returns = episode_returns(jax.random.split(jax.random.PRNGKey(0), episodes), params)
    optimum, bound = COOP.optimal_return(params), COOP.teammate_blind_bound(params)
    alive_steps = 8.0 if death_prob == 0 else (1 - 0.75**8) / 0.25
    assert optimum == pytest.approx(alive_steps * (1 - 0.5 / 3)) and bound == pytest.approx(alive_steps / 3)
    if death_prob == 0:
        assert optimum == pytest.approx(20 / 3) and bound == pytest.approx(8 / 3)
    # The oracle names the target even when disabled: it scores exactly when the optimum does.
    for name, want in [("oracle", optimum), ("own_card", bound), ("random", bound)]:
        got = returns[name]
        assert abs(float(got.mean()) - want) < 4 * float(got.std()) / np.sqrt(episodes) + 1e-6, (name, got.mean(), want)


def test_step_is_the_same_jitted_and_not_jitted():
    env, step, reset = jitted()
    params = env.default_params.replace(death_prob=0.3)
    _, state = reset(jax.random.PRNGKey(5), params)
    actions = jnp.array([1, 2])
    with jax.disable_jit():
        eager = env.step(jax.random.PRNGKey(6), state, actions, params)
    compiled = step(jax.random.PRNGKey(6), state, actions, params)
    jax.tree.map(np.testing.assert_array_equal, eager, compiled)
