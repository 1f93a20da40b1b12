"""The JaxMARL adapter (rlx/envs/jaxmarl.py): MPE simple_spread and SMAX 3m / 2s3z against JaxMARL's own dict envs.

Each environment compiles one reset and one rollout program (``programs``), jitted and vmapped
over ``NUM_ENVS`` environments; every test here reuses them. The rollout steps the adapter and
JaxMARL's own auto-resetting ``step`` side by side with the same keys and the same (masked random)
actions; the episode limit is a traced parameter, so changing it does not recompile.
Skips when jaxmarl is not installed.
"""

import functools
import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.envs.jaxmarl import JaxMARLEnv, make_jaxmarl
from rlx.envs.registry import import_env_module
from rlx.errors import UnknownNameError

# find_spec, not importorskip: importing the jaxmarl package would load every environment family (~6 s)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("jaxmarl") is None,
                                reason="jaxmarl is not installed; pip install jaxmarl (version in pyproject.toml)")

spaces = import_env_module("gymnax.environments.spaces")

# name -> (agents, observation size, actions, world-state size, default episode limit)
ENVS = {
    "MPE_simple_spread_v3": (3, 18, 5, 54, 25),
    "3m": (3, 75, 8, 72, 100),
    "2s3z": (5, 127, 10, 120, 100),
}
NUM_ENVS = 8
# XLA's CPU backend needs ~15 s to optimise a SMAX step; unoptimised code compiles in a third of that
# and is fast enough for the few steps here (both sides of each comparison are compiled alike).
FAST_COMPILE = {"xla_backend_optimization_level": 0}
STEPS = {"MPE_simple_spread_v3": 27, "3m": 12, "2s3z": 12}  # one rollout length per env: one compile


@functools.cache
def programs(name):
    """``(env, reset, rollout)``: ``reset(keys[E], params)``; ``rollout(key, state, params)`` returns, for
    ``STEPS[name]`` steps (leading axes ``[T, E]``), the adapter's outputs and JaxMARL's for the same keys."""
    env = make_jaxmarl(name)
    raw = env.env
    reset = jax.jit(jax.vmap(env.reset, in_axes=(0, None)), compiler_options=FAST_COMPILE)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    raw_step = jax.vmap(raw.step)
    stack = lambda d: jnp.stack([d[a] for a in env.agents], axis=1)  # noqa: E731  # dict of [E] -> [E, n]

    @functools.partial(jax.jit, compiler_options=FAST_COMPILE)
    def rollout(key, state, params):
        def one(carry, key):
            state, raw_state = carry
            action_key, step_key = jax.random.split(key)
            mask = jax.vmap(env.action_mask, in_axes=(0, None))(state, params)
            actions = jax.random.categorical(action_key, jnp.where(mask, 0.0, -jnp.inf)).astype(jnp.int32)
            keys = jax.random.split(step_key, NUM_ENVS)
            obs, new_state, reward, terminated, truncated, info = step(keys, state, actions, params)
            raw_actions = {a: actions[:, i] for i, a in enumerate(env.agents)}
            raw_obs, raw_new, raw_reward, raw_dones, _ = raw_step(keys, raw_state, raw_actions)
            raw_mask = (stack(jax.vmap(raw.get_avail_actions)(raw_state)).astype(bool)
                        if env.family == "smax" else jnp.ones_like(mask))
            out = dict(
                mask=mask, raw_mask=raw_mask, obs=obs, reward=reward, terminated=terminated, truncated=truncated,
                final_observation=info["final_observation"], final_world_state=info["final_world_state"],
                episode_over=info["episode_over"], won=info.get("won", jnp.zeros(NUM_ENVS, bool)),
                time=new_state.time, alive=jax.vmap(env.alive, in_axes=(0, None))(new_state, params),
                world_state=jax.vmap(env.world_state, in_axes=(0, None))(new_state, params),
                # what the adapter's step resets to (its reset key is the second half of the step key)
                reset_obs=jax.vmap(lambda k: env.reset_env(jax.random.split(k)[1], params)[0])(keys),
                raw_obs=stack(raw_obs), raw_reward=stack(raw_reward), raw_dones=stack(raw_dones),
                raw_done_all=raw_dones["__all__"],
            )
            return (new_state, raw_new), out

        return jax.lax.scan(one, (state, state.env_state), jax.random.split(key, STEPS[name]))[1]

    return env, reset, rollout


def run(name, seed=0, params=None, edit_state=None):
    """(env, first observations, per-step outputs as NumPy arrays) of ``STEPS[name]`` steps."""
    env, reset, rollout = programs(name)
    params = env.default_params if params is None else params
    obs, state = reset(jax.random.split(jax.random.PRNGKey(seed), NUM_ENVS), params)
    if edit_state is not None:
        state = edit_state(state)
    return env, obs, jax.tree.map(np.asarray, rollout(jax.random.PRNGKey(seed + 1), state, params))


def before_first_reset(out):
    """bool[T, E]: steps at or before which neither the adapter nor JaxMARL has reset."""
    ended = out["episode_over"] | out["raw_done_all"]
    return np.cumsum(ended, axis=0) - ended == 0


@pytest.mark.parametrize("name", list(ENVS))
def test_spaces_and_shapes(name):
    n, obs_size, num_actions, world_size, limit = ENVS[name]
    env, obs, out = run(name)
    out = jax.tree.map(lambda x: x[:3], out)
    params = env.default_params
    assert isinstance(env, JaxMARLEnv) and env.num_agents == n
    assert params.max_steps_in_episode == limit
    assert isinstance(env.observation_space(params), spaces.Box) and env.observation_space(params).shape == (obs_size,)
    assert isinstance(env.action_space(params), spaces.Discrete) and env.action_space(params).n == num_actions
    assert env.world_state_space(params).shape == (world_size,)
    assert obs.shape == (NUM_ENVS, n, obs_size) and obs.dtype == jnp.float32
    for key, shape in [("obs", (n, obs_size)), ("final_observation", (n, obs_size)), ("reward", (n,)),
                       ("terminated", (n,)), ("truncated", (n,)), ("mask", (n, num_actions)), ("alive", (n,)),
                       ("world_state", (world_size,)), ("final_world_state", (world_size,)), ("episode_over", ())]:
        assert out[key].shape == (3, NUM_ENVS, *shape), key
    assert out["obs"].dtype == np.float32 and out["reward"].dtype == np.float32
    assert out["terminated"].dtype == np.bool_ and out["mask"].dtype == np.bool_
    assert np.all(out["time"] == np.arange(1, 4)[:, None])


@pytest.mark.parametrize("name", list(ENVS))
def test_matches_jaxmarl_step_by_step(name):
    """Same keys and actions: the adapter's observations, rewards and per-agent dones are JaxMARL's."""
    env, _, out = run(name)
    same = before_first_reset(out)  # the step that ends an episode included
    assert same[:8].all(), "episodes ended early; pick another seed"
    ended = out["episode_over"] | out["raw_done_all"]  # both environments return the same state and observation
    np.testing.assert_allclose(out["obs"][same & ~ended], out["raw_obs"][same & ~ended], rtol=1e-6, atol=1e-6)
    before_raw_reset = same & ~out["raw_done_all"]  # the adapter's observation before its own reset
    np.testing.assert_allclose(out["final_observation"][before_raw_reset], out["raw_obs"][before_raw_reset],
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out["reward"][same], out["raw_reward"][same], rtol=1e-6, atol=1e-6)
    if env.family == "smax":  # JaxMARL's per-agent done is "dead"; the adapter's terminated too, before the end
        np.testing.assert_array_equal(out["terminated"][same], out["raw_dones"][same])
    else:
        assert not out["terminated"].any()


def test_mpe_truncates_at_the_episode_limit_and_resets():
    env, _, out = run("MPE_simple_spread_v3")
    last = 24  # the 25th step
    assert not out["terminated"].any()
    assert out["truncated"][last].all() and out["episode_over"][last].all()
    assert not out["truncated"][:last].any() and not out["truncated"][last + 1:].any()
    assert np.all(out["time"][last] == 0) and np.all(out["time"][last + 1] == 1)
    # the returned observation is the fresh episode's; final_observation keeps the last one
    np.testing.assert_array_equal(out["obs"][last], out["reset_obs"][last])
    np.testing.assert_allclose(out["final_observation"][last], out["raw_obs"][last], rtol=1e-6, atol=1e-6)
    assert not np.allclose(out["obs"][last], out["final_observation"][last])
    np.testing.assert_allclose(out["final_world_state"][last], out["raw_obs"][last].reshape(NUM_ENVS, -1), rtol=1e-6)
    # JaxMARL's own done is one step later (it compares the step count before incrementing it)
    assert not out["raw_done_all"][last].any() and out["raw_done_all"][last + 1].all()
    # the limit is a traced parameter
    _, _, short = run("MPE_simple_spread_v3", params=env.default_params.replace(max_steps_in_episode=3))
    assert short["truncated"][2::3].all() and not short["truncated"][0::3].any() and not short["truncated"][1::3].any()


def test_smax_time_limit_is_truncation():
    env, _, out = run("3m", params=programs("3m")[0].default_params.replace(max_steps_in_episode=4))
    running = ~out["episode_over"][:3].any(0)  # no episode ended in the first 3 steps
    undecided = running & ~out["won"][3] & ~out["terminated"][3].all(-1)
    assert undecided.sum() >= NUM_ENVS // 2
    assert out["truncated"][3][undecided].all() and not out["truncated"][:3][:, running].any()
    assert out["episode_over"][3][running].all() and np.all(out["time"][3][running] == 0)
    np.testing.assert_array_equal(out["obs"][3][running], out["reset_obs"][3][running])
    assert out["alive"][3][running].all()  # a fresh episode


def test_smax_win_is_termination():
    """Enemies already dead: the battle is won at the next step, every ally terminated, not truncated."""
    env = programs("3m")[0]

    def kill_enemies(state):
        units = state.env_state.state
        allies = env.env.num_allies
        units = units.replace(unit_health=units.unit_health.at[:, allies:].set(0.0),
                              unit_alive=units.unit_alive.at[:, allies:].set(False))
        return state.replace(env_state=state.env_state.replace(state=units))

    _, _, out = run("3m", edit_state=kill_enemies)
    assert out["terminated"][0].all() and out["won"][0].all() and out["episode_over"][0].all()
    assert not out["truncated"][0].any()
    assert out["raw_done_all"][0].all()
    np.testing.assert_array_equal(out["obs"][0], out["reset_obs"][0])
    assert out["reward"][0].min() >= 1.0  # JaxMARL's won-battle bonus
    assert not out["won"][1].any()
    assert env.episode_outcomes == ("won",)  # so evaluation reports a win rate


@pytest.mark.parametrize("name", ["3m", "2s3z"])
def test_smax_action_masks_match_get_avail_actions(name):
    env, _, out = run(name)
    n, _, num_actions, _, _ = ENVS[name]
    # masks are taken before each step: step 0 and the steps after ones where neither env reset
    same = np.concatenate([np.ones((1, NUM_ENVS), bool), before_first_reset(out)[:-1]])
    np.testing.assert_array_equal(out["mask"][same], out["raw_mask"][same])
    assert out["mask"][..., 4].all()  # "stop" is always available
    # the adapter's alive flags are JaxMARL's unit_alive; dead units may only stop
    dead = ~out["alive"][:-1] & ~out["episode_over"][:-1, :, None]
    assert np.all(out["mask"][1:][dead].sum(-1) == 1)


def test_mpe_masks_allow_everything():
    env, _, out = run("MPE_simple_spread_v3")
    assert out["mask"].all() and out["alive"].all()
    assert env.episode_outcomes == ()  # no battle to win


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UnknownNameError, match="MPE_simple_spread_v3.*3m"):
        make_jaxmarl("MPE_nonexistent")


def test_options_reach_jaxmarl_and_misspelt_ones_are_refused():
    """``env.options`` go on to JaxMARL's constructors through ``**kwargs`` (they were all refused, the
    valid list reading "kwargs"); JaxMARL's MPE ignores keywords it does not know, so the registry checks them."""
    from rlx.envs import registry
    from rlx.errors import ConfigError

    env, _ = registry.make("mpe_spread", {"num_agents": 4, "num_landmarks": 4})
    assert env.num_agents == 4
    with pytest.raises(ConfigError, match="env.options.num_agent: unknown option of mpe_spread; valid: num_agents,"):
        registry.make("mpe_spread", {"num_agent": 4})
    assert registry.make("smax_3m", {"attack_mode": "random", "won_battle_bonus": 2.0})[0].num_agents == 3
    with pytest.raises(ConfigError, match="env.options.max_step: unknown option of smax_3m; valid: enemy_shoots, attack_mode"):
        registry.make("smax_3m", {"max_step": 50})
    # Keywords that would crash (the scenario passes them to its base itself) or do nothing (the map sets them).
    for name, option in (("mpe_spread", {"dim_c": 2}), ("mpe_spread", {"agents": ["a", "b", "c"]}),
                         ("smax_3m", {"num_allies": 5})):
        with pytest.raises(ConfigError, match=f"env.options.{next(iter(option))}: unknown option of {name}"):
            registry.make(name, option)
    assert registry.make("mpe_spread", {"max_steps": 30})[0].num_agents == 3  # a base keyword that passes through


def test_jaxmarl_package_init_is_not_imported():
    """MPE and SMAX modules load without jaxmarl's package __init__ (every environment family, ~6 s)."""
    programs("MPE_simple_spread_v3")
    programs("3m")
    if "jaxmarl" not in sys.modules:  # else something else imported the whole package
        assert "jaxmarl.environments.storm.storm_env" not in sys.modules


def test_agents_spaces_count_as_one_only_with_the_same_kind_size_and_bounds():
    from gymnax.environments import spaces

    from rlx.envs.jaxmarl import _same_space

    box = spaces.Box(-1.0, 1.0, (3,), jnp.float32)
    assert _same_space(box, spaces.Box(-1.0, 1.0, (3,), jnp.float32))
    assert not _same_space(box, spaces.Box(-2.0, 1.0, (3,), jnp.float32))  # same shape, other bounds
    assert not _same_space(box, spaces.Box(-1.0, 1.0, (4,), jnp.float32))
    assert _same_space(spaces.Discrete(5), spaces.Discrete(5)) and not _same_space(spaces.Discrete(5), spaces.Discrete(4))
