"""MinAtar and brax through the registry: spaces, stepping under jit and vmap, the brax adapter's episode ends.

Each environment compiles one reset and one rollout program (``programs``), shared by
every test here; episode lengths are parameters (traced), so changing them does not
recompile. Brax tests skip when brax is not installed (``pip install -e .[brax]``).
"""

import functools
import importlib.util
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlx.envs import registry
from rlx.errors import ConfigError

HAS_BRAX = importlib.util.find_spec("brax") is not None
needs_brax = pytest.mark.skipif(not HAS_BRAX, reason="brax is not installed; pip install -e .[brax]")
# brax 0.14.2 reads two MuJoCo 4 fields the old way while tracing (still correct, deprecated).
pytestmark = pytest.mark.filterwarnings("ignore:Accessing .* directly from `Data` is deprecated:DeprecationWarning")

# name -> (observation shape, number of actions or size of the action vector); observations are float32
MINATAR = {
    "Asterix-MinAtar": ((10, 10, 4), 5),
    "Breakout-MinAtar": ((10, 10, 4), 3),
    "Freeway-MinAtar": ((10, 10, 7), 3),
    "SpaceInvaders-MinAtar": ((10, 10, 6), 4),
}
BRAX = {
    "brax-ant": ((27,), 8),
    "brax-halfcheetah": ((17,), 6),
    "brax-hopper": ((11,), 3),
    "brax-inverted_pendulum": ((4,), 1),
}
NUM_ENVS, NUM_STEPS = 2, 4
# A brax step is a large program: without LLVM's expensive optimisations XLA compiles these
# (which run a few steps only) about 1.6x faster on CPU; the brax tests are mostly compile time.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@functools.cache
def programs(name):
    """``(env, params, reset, rollout)``: jitted, vmapped over ``NUM_ENVS`` environments.

    ``rollout(key, state, actions[NUM_STEPS, NUM_ENVS, ...], params)`` returns the last
    state and, per step, (obs, reward, terminated, truncated, final_observation, time).
    """
    env, params = registry.make(name)
    vmapped_reset = jax.vmap(env.reset, in_axes=(0, None))
    vmapped_step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def rollout(key, state, actions, params):
        def step(state, inputs):
            key, action = inputs
            obs, state, reward, terminated, truncated, info = vmapped_step(
                jax.random.split(key, NUM_ENVS), state, action, params
            )
            return state, (obs, reward, terminated, truncated, info["final_observation"], state.time)

        return jax.lax.scan(step, state, (jax.random.split(key, NUM_STEPS), actions))

    keys = jax.random.split(jax.random.PRNGKey(0), NUM_ENVS)
    state = jax.eval_shape(vmapped_reset, keys, params)[1]
    actions = jax.eval_shape(lambda key: random_actions(env, params, key), jax.random.PRNGKey(0))
    reset = jax.jit(vmapped_reset).lower(keys, params).compile(FAST_COMPILE)
    rollout = jax.jit(rollout).lower(jax.random.PRNGKey(0), state, actions, params).compile(FAST_COMPILE)
    return env, params, reset, rollout


def random_actions(env, params, key):
    keys = jax.random.split(key, NUM_STEPS * NUM_ENVS).reshape(NUM_STEPS, NUM_ENVS, -1)
    return jax.vmap(jax.vmap(env.action_space(params).sample))(keys)


def constant_actions(env, params, value):
    return jnp.full((NUM_STEPS, NUM_ENVS) + env.action_space(params).shape, value, jnp.float32)


# Every brax entry goes through the same adapter: the fast suite steps inverted_pendulum (the time-limit and
# termination tests below reuse its compiled programs); the others, 10-17 s of compiling each, are `slow`.
BRAX_SLOW = {"brax-ant", "brax-halfcheetah", "brax-hopper"}


@pytest.mark.parametrize(
    "name",
    list(MINATAR) + [pytest.param(name, marks=[needs_brax] + ([pytest.mark.slow] if name in BRAX_SLOW else []))
                     for name in BRAX],
)
def test_entry_resets_and_steps_under_jit_and_vmap(name):
    obs_shape, num_actions = {**MINATAR, **BRAX}[name]
    env, params, reset, rollout = programs(name)
    observation_space, action_space = env.observation_space(params), env.action_space(params)
    assert observation_space.shape == obs_shape and observation_space.dtype == jnp.float32
    if name in MINATAR:
        assert action_space.n == num_actions and action_space.dtype == jnp.int32
    else:
        assert action_space.shape == (num_actions,) and action_space.dtype == jnp.float32
        assert float(action_space.low) == -1.0 and float(action_space.high) == 1.0

    obs, state = reset(jax.random.split(jax.random.PRNGKey(0), NUM_ENVS), params)
    assert obs.shape == (NUM_ENVS,) + obs_shape and obs.dtype == jnp.float32
    actions = random_actions(env, params, jax.random.PRNGKey(1))
    assert actions.shape == (NUM_STEPS, NUM_ENVS) + action_space.shape
    state, (obs, reward, terminated, truncated, final_obs, time) = rollout(jax.random.PRNGKey(2), state, actions, params)
    assert obs.shape == final_obs.shape == (NUM_STEPS, NUM_ENVS) + obs_shape and obs.dtype == jnp.float32
    assert reward.shape == terminated.shape == truncated.shape == (NUM_STEPS, NUM_ENVS)
    assert terminated.dtype == truncated.dtype == jnp.bool_
    assert jnp.issubdtype(reward.dtype, jnp.floating)
    assert np.isfinite(obs).all() and np.isfinite(reward).all()
    if name in MINATAR:
        assert set(np.unique(obs).tolist()) <= {0.0, 1.0}  # one-hot channels
    done = np.asarray(terminated | truncated)
    for i in range(NUM_ENVS):  # the state's clock counts steps until the episode's first end
        end = int(np.argmax(done[:, i])) if done[:, i].any() else NUM_STEPS
        np.testing.assert_array_equal(time[:end, i], np.arange(1, end + 1))


def test_options_for_an_environment_without_any_say_so_and_name_its_params():
    """CartPole takes no options: the message used to end in an empty 'valid: ' list."""
    with pytest.raises(ConfigError, match=r"env.options.foo: CartPole-v1 takes no env.options; its env.params are "
                                          r"force_mag, gravity, length, .*x_threshold$"):
        registry.make("CartPole-v1", {"foo": 1})


@needs_brax
def test_brax_options_reach_the_brax_environment():
    env, _ = registry.make("brax-inverted_pendulum", {"backend": "generalized"})
    assert env.backend == "generalized"
    from rlx.envs.brax import forwarded_options

    assert "terminate_when_unhealthy" in forwarded_options("hopper")  # a keyword brax's Hopper takes
    with pytest.raises(ConfigError, match="env.options.n_frame: unknown option of brax-inverted_pendulum; valid: backend, "):
        registry.make("brax-inverted_pendulum", {"n_frame": 2})


@needs_brax
def test_brax_time_limit_truncates_resets_and_keeps_the_last_observation():
    env, params, reset, rollout = programs("brax-inverted_pendulum")
    _, state0 = reset(jax.random.split(jax.random.PRNGKey(3), NUM_ENVS), params)
    zero = constant_actions(env, params, 0.0)  # the pole needs ~50 steps to fall without a push
    key = jax.random.PRNGKey(4)
    _, (obs, _, terminated, truncated, final_obs, time) = rollout(key, state0, zero, params.replace(max_steps_in_episode=3))
    _, (free_obs, _, free_terminated, free_truncated, _, _) = rollout(key, state0, zero, params)

    assert not terminated.any() and not free_terminated.any() and not free_truncated.any()
    np.testing.assert_array_equal(truncated, [[False] * NUM_ENVS, [False] * NUM_ENVS, [True] * NUM_ENVS, [False] * NUM_ENVS])
    np.testing.assert_array_equal(time[:, 0], [1, 2, 0, 1])
    # Before the limit the observation is the state's; at the limit, final_observation is the
    # observation the episode really ended in (the untruncated run's third one), obs the reset's.
    np.testing.assert_array_equal(final_obs[:2], obs[:2])
    np.testing.assert_allclose(final_obs[2], free_obs[2], atol=1e-6)
    assert np.abs(obs[2]).max() <= 0.01 < np.abs(final_obs[2] - obs[2]).max()  # reset noise is within 0.01
    assert not np.allclose(obs[3], free_obs[3])  # the next step continues the new episode


@needs_brax
def test_brax_termination_resets_and_keeps_the_last_observation():
    env, params, reset, rollout = programs("brax-inverted_pendulum")
    obs, state = reset(jax.random.split(jax.random.PRNGKey(5), NUM_ENVS), params)
    actions = constant_actions(env, params, 1.0)  # the cart pushed at full force: the pole falls
    for call in range(100):
        state, (obs, _, terminated, truncated, final_obs, time) = rollout(jax.random.PRNGKey(call), state, actions, params)
        if terminated.any():
            break
    assert terminated.any(), "the pole never fell in 400 steps of full force"
    step, env_index = np.argwhere(terminated)[0]
    assert not truncated[step, env_index] and time[step, env_index] == 0  # auto-reset
    assert not np.allclose(final_obs[step, env_index], obs[step, env_index])


def test_missing_brax_gives_one_line_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)
    monkeypatch.setitem(sys.modules, "brax.envs", None)
    with pytest.raises(ConfigError, match=r"^brax is not installed; pip install -e \.\[brax\]$"):
        registry.make("brax-ant")
    assert registry.installed("Breakout-MinAtar")


@pytest.mark.slow  # ~20 s; the Brax adapter's own tests above stay in the fast suite
@needs_brax
def test_cli_trains_ppo_on_brax(run_cli, tmp_path):
    done = run_cli("+exp=ppo_brax", "algo.total_timesteps=256", "algo.num_envs=4", "algo.num_steps=32",
                   "algo.num_minibatches=2", "run.num_seeds=1", "run.eval_episodes=2",
                   "env.params.max_steps_in_episode=64", "run.checkpoint_every_chunks=0", "logger=none")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env"] == "brax-inverted_pendulum" and summary["status"] == "completed"
    assert summary["env_steps_per_seed"] == 256 and 0 < summary["final_eval"]["return_mean"] <= 64


@pytest.mark.slow
@pytest.mark.parametrize("preset, threshold", [pytest.param("ppo_brax", 900.0, marks=needs_brax),
                                               ("ppo_minatar", 30.0)])
def test_slow_suite_presets_reach_their_thresholds(run_cli, tmp_path, preset, threshold):
    done = run_cli(f"+exp={preset}", "logger=none", timeout=3600, full_opt=True)  # compiled as a user runs it
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_eval"]["return_mean"] >= threshold, summary["final_eval"]



def mlp_size(sizes):
    """Parameters of dense layers of the given widths (weights and biases)."""
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


# agent -> (extra config, expected parameter count on Breakout's 10x10x4 grid with 3 actions)
GRID_AGENTS = {
    "ppo mlp": ("ppo", {"num_minibatches": 2}, mlp_size([400, 64, 64, 3]) + mlp_size([400, 64, 64, 1])),
    # per network: conv 2x2x4->32 (+bias, 'SAME': 10x10x32), 2x2 average pool -> 5x5x32 = 800 features
    "ppo cnn": ("ppo", {"num_minibatches": 2, "torso": "cnn"},
                2 * (2 * 2 * 4 * 32 + 32) + mlp_size([800, 64, 64, 3]) + mlp_size([800, 64, 64, 1])),
    "a2c": ("a2c", {}, mlp_size([400, 64, 64, 3]) + mlp_size([400, 64, 64, 1])),
    "ppo_rnn": ("ppo_rnn", {"num_minibatches": 2}, None),
}


@pytest.mark.parametrize("name", list(GRID_AGENTS))
def test_agents_learn_from_grid_observations(name):
    """Grid observations are flattened (mlp) or convolved (cnn) as a whole, and two updates stay finite."""
    import importlib

    module_name, extra, expected_params = GRID_AGENTS[name]
    module = importlib.import_module(f"rlx.agents.{module_name}")
    env, params = registry.make("Breakout-MinAtar")
    config = module.Config(total_timesteps=128, num_envs=4, num_steps=16, **extra)
    module.validate(config)
    agent = module.make(config, env, params)
    state, metrics = jax.jit(lambda key: jax.lax.scan(lambda s, _: agent.update(s), agent.init(key), None, 2))(
        jax.random.PRNGKey(0))
    assert np.all(np.isfinite(np.asarray(metrics["loss"])))
    if expected_params is not None:
        assert state.params.shape == (expected_params,)
    obs, _ = env.reset(jax.random.PRNGKey(1), params)
    action = agent.act(state.policy, obs, jax.random.PRNGKey(2), True) if module_name != "ppo_rnn" else None
    assert action is None or action.shape == ()


def test_ppo_cnn_torso_needs_grid_observations():
    from rlx.agents import ppo

    env, params = registry.make("CartPole-v1")
    with pytest.raises(ValueError, match="torso='cnn'.*shape \\(4,\\)"):
        ppo.make(ppo.Config(torso="cnn"), env, params)
    with pytest.raises(ValueError, match="torso='rnn': must be one of"):
        ppo.validate(ppo.Config(torso="rnn"))
