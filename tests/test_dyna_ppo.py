"""Dyna-PPO: imagination against a hand-written model, a learned linear system, validation, a short CartPole run."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

from rlx.agents import dyna_ppo


def test_imagine_follows_a_hand_written_model():
    """next = obs + step, reward = obs[0], terminated once obs[1] reaches 3: every number is known."""
    step_size = 1.0

    def model_step(params, obs, action, key):
        next_obs = obs + params
        logit = jnp.where(next_obs[:, 1] >= 3.0, 10.0, -10.0)
        return next_obs, obs[:, 0] + action, logit

    def policy_fn(obs, key):  # action 1 when obs[0] is odd
        return (obs[:, 0].astype(jnp.int32) % 2).astype(jnp.float32)

    start = jnp.array([[0.0, 0.0], [10.0, 2.0], [5.0, -10.0]])
    traj = jax.jit(dyna_ppo.imagine_with, static_argnums=(0, 2, 4))(
        model_step, step_size, policy_fn, start, 5, jax.random.PRNGKey(0)
    )
    traj = jax.tree.map(np.asarray, traj)
    assert traj.obs.shape == (5, 3, 2) and traj.mask.shape == (5, 3)

    # Branch 0 terminates on its third step (obs[1] 2 -> 3), then stays frozen at its last live observation.
    np.testing.assert_array_equal(traj.obs[:, 0], [[0, 0], [1, 1], [2, 2], [2, 2], [2, 2]])
    np.testing.assert_array_equal(traj.mask[:, 0], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(traj.terminated[:3, 0], [0, 0, 1])
    np.testing.assert_array_equal(traj.reward[:3, 0], [0, 1 + 1, 2])  # obs[0] + (obs[0] odd)
    np.testing.assert_array_equal(traj.next_obs[2, 0], [3, 3])
    # Branch 1 terminates on its first step.
    np.testing.assert_array_equal(traj.mask[:, 1], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(traj.obs[:, 1], np.tile([10.0, 2.0], (5, 1)))
    # Branch 2 never terminates within the horizon.
    np.testing.assert_array_equal(traj.mask[:, 2], np.ones(5))
    np.testing.assert_array_equal(traj.obs[:, 2, 0], 5 + np.arange(5))
    np.testing.assert_array_equal(traj.reward[:, 2], [5 + 1, 6, 7 + 1, 8, 9 + 1])
    np.testing.assert_array_equal(traj.action[:, 2], [1, 0, 1, 0, 1])
    imagined_return = (traj.reward * traj.mask).sum(0)
    np.testing.assert_array_equal(imagined_return, [4, 10, 38])


def test_imagined_advantages_bootstrap_at_the_horizon_and_stop_at_terminations():
    gamma, lam, v = 0.9, 1.0, 2.0
    ones = jnp.ones((2, 2))
    terminated = jnp.array([[0.0, 1.0], [0.0, 0.0]])  # branch 1 terminates on its first step
    traj = dyna_ppo.Imagined(obs=None, action=None, reward=ones, terminated=terminated,
                             mask=jnp.array([[1.0, 1.0], [1.0, 0.0]]), next_obs=None)
    _, targets = dyna_ppo.imagined_advantages(traj, v * ones, v * ones, gamma, lam)
    # Branch 0: two rewards, then the value of the state after the horizon. Branch 1: one reward, no bootstrap.
    assert targets[0, 0] == pytest.approx(1 + gamma + gamma**2 * v)
    assert targets[1, 0] == pytest.approx(1 + gamma * v)
    assert targets[0, 1] == pytest.approx(1.0)


@struct.dataclass
class LinearState(environment.EnvState):
    x: jax.Array


@struct.dataclass
class LinearParams(environment.EnvParams):
    max_steps_in_episode: int = 10


A = np.array([[0.9, 0.2], [-0.2, 0.9]], np.float32)
B = np.array([[0.0], [0.5]], np.float32)


class LinearSystem(environment.Environment):
    """x' = A x + B a from x ~ U[-1, 1]^2, reward x[0], episodes truncated after 10 steps, never terminated."""

    @property
    def default_params(self):
        return LinearParams()

    def reset_env(self, key, params):
        x = jax.random.uniform(key, (2,), minval=-1.0, maxval=1.0)
        return x, LinearState(time=0, x=x)

    def step_env(self, key, state, action, params):
        x = A @ state.x + B @ jnp.reshape(action, (1,))
        return x, LinearState(time=state.time + 1, x=x), state.x[0], jnp.array(False), {}

    def observation_space(self, params):
        return spaces.Box(-10.0, 10.0, (2,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Box(-1.0, 1.0, (1,), jnp.float32)


def test_dynamics_model_recovers_a_linear_system(optimised):
    env = LinearSystem()
    config = dyna_ppo.Config(
        total_timesteps=1024, num_envs=8, num_steps=32, train_ratio=1.0, num_epochs=2, ensemble_size=2,
        model_hidden_sizes=(64, 64), model_batch_size=128, num_branches=256, horizon=2, holdout_size=32,
        buffer_size=4096, model_lr=3e-3,
    )
    dyna_ppo.validate(config)
    agent = dyna_ppo.make(config, env, env.default_params)

    @jax.jit
    def run(key):
        return jax.lax.scan(lambda s, _: agent.update(s), agent.init(key), None, config.num_updates)

    state, metrics = run(jax.random.PRNGKey(0))
    assert metrics["model_error_1step"][-1] < metrics["model_error_1step"][0]

    key = jax.random.PRNGKey(1)
    x = jax.random.uniform(key, (400, 2), minval=-0.8, maxval=0.8)  # fresh inputs, not from the buffer
    a = jax.random.uniform(jax.random.fold_in(key, 1), (400, 1), minval=-1.0, maxval=1.0)
    expected = x @ A.T + a @ B.T
    for member in range(config.ensemble_size):  # every member, not just the average, learned the system
        params = state.model_params[member:member + 1].repeat(config.ensemble_size, 0)
        next_obs, reward, logit = agent.model_step(params, state.model_stats, x, a, jax.random.PRNGKey(2))
        assert float(jnp.abs(next_obs - expected).max()) < 0.02
        assert float(jnp.sqrt(((next_obs - expected) ** 2).mean())) < 0.005
        assert float(jnp.abs(reward - x[:, 0]).max()) < 0.02
        assert bool((logit < 0).all())  # nothing ever terminated

    # agent.imagine(world model, policy, starts, horizon, key): the policy's actions through the learned system
    starts = x[:256]
    traj = jax.jit(agent.imagine, static_argnums=3)(state.world_model, state.policy, starts, 3, jax.random.PRNGKey(3))
    traj = jax.tree.map(np.asarray, traj)
    assert traj.obs.shape == (3, 256, 2) and traj.action.shape == (3, 256, 1) and (traj.mask == 1).all()
    np.testing.assert_array_equal(traj.obs[0], np.asarray(starts))
    np.testing.assert_array_equal(traj.obs[1:], traj.next_obs[:-1])
    applied = np.clip(traj.action, -1.0, 1.0)  # the policy's raw samples; the environment clips them
    np.testing.assert_allclose(traj.next_obs[0], traj.obs[0] @ np.asarray(A).T + applied[0] @ np.asarray(B).T, atol=0.03)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(lr=0.0), "lr=0.0: must be > 0"),
        (dict(real_fraction=1.5), "real_fraction=1.5: must be in [0, 1]"),
        (dict(train_ratio=0.0), "train_ratio=0.0: must be > 0"),
        (dict(train_ratio=0.3), "train_ratio=0.3: train_ratio*real_steps_per_update (=38.4 gradient steps"),
        (dict(train_ratio=0.125, num_epochs=3),
         "train_ratio=0.125: train_ratio*real_steps_per_update (=16 gradient steps per update, "
         "real_steps_per_update=num_envs*num_steps=128) must be a whole multiple of num_epochs=3"),
        (dict(train_ratio=8.0), "train_ratio=8.0: gives 256 PPO minibatches per epoch (train_ratio*real_steps_per_"
                                "update/num_epochs), leaving 0 of the 128 real steps in each: needs >= 2"),
        (dict(num_branches=501), "num_branches=501: must be a multiple of ensemble_size=5"),
        (dict(holdout_size=128), "holdout_size=128: must be in [0, real_steps_per_update=128)"),
        (dict(buffer_size=100), "buffer_size=100: must be >= real_steps_per_update=128"),
        (dict(horizon=0), "horizon=0: must be >= 1"),
        (dict(model_activation="sine"), "model_activation='sine': must be one of"),
        (dict(total_timesteps=100), "total_timesteps=100: must be >= one batch"),
    ],
)
def test_validate_names_field_value_and_rule(overrides, message):
    config = dataclasses.replace(dyna_ppo.Config(), **overrides)
    with pytest.raises(ValueError) as error:
        dyna_ppo.validate(config)
    assert message in str(error.value), str(error.value)


def test_defaults_are_valid_and_the_ratio_is_explicit():
    config = dyna_ppo.Config()
    dyna_ppo.validate(config)
    assert config.real_steps_per_update == config.num_envs * config.num_steps
    assert config.grad_steps == config.train_ratio * config.real_steps_per_update
    assert config.num_minibatches * config.num_epochs == config.grad_steps


def test_real_bootstraps_use_the_statistics_the_rollout_acted_with(monkeypatch):
    """With observation normalisation, the value bootstrapped for a step's next state must be the value that state
    got when the agent stood in it: both read the statistics from before the update refreshed them."""
    from gymnax.environments.classic_control.cartpole import CartPole

    env = CartPole()
    config = dyna_ppo.Config(total_timesteps=128, num_envs=2, num_steps=16, normalize_observations=True,
                             hidden_sizes=(8,), model_hidden_sizes=(8,), ensemble_size=2, num_epochs=1)
    calls, original = [], dyna_ppo.gae

    def recorded_gae(*args):  # hands its inputs out of the compiled update
        jax.debug.callback(lambda *values: calls.append(values), *args[:5])
        return original(*args)

    monkeypatch.setattr(dyna_ppo, "gae", recorded_gae)
    agent = dyna_ppo.make(config, env, env.default_params)
    state = agent.init(jax.random.PRNGKey(0))
    jax.block_until_ready(jax.jit(agent.update)(state))  # refits the statistics (from the reset observations)
    real = [call for call in calls if np.shape(call[1]) == (16, 2)]  # [num_steps, num_envs]; imagined ones differ
    assert len(real) == 1, [np.shape(call[1]) for call in calls]
    rewards, values, next_values, terminated, done = map(np.asarray, real[0])
    continuing = ~done[:-1].astype(bool)
    assert continuing.sum() > 20
    np.testing.assert_allclose(next_values[:-1][continuing], values[1:][continuing], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # about 35 s; the vendoring test trains the same file to return 100 in the fast suite
def test_cartpole_learns_from_few_real_steps():
    from gymnax.environments.classic_control.cartpole import CartPole

    env = CartPole()
    config = dyna_ppo.cartpole_config(total_timesteps=3072)
    state, metrics = dyna_ppo.train(config, env, env.default_params, jax.random.PRNGKey(0))
    metrics = jax.tree.map(np.asarray, metrics)
    for name in ("train_return", "model_loss", "model_error_1step", "reward_mse", "termination_accuracy",
                 "imagined_return", "imagined_length", "train_ratio", "policy_loss", "value_loss", "approx_kl"):
        assert np.isfinite(metrics[name]).all(), name
    np.testing.assert_allclose(metrics["train_ratio"], config.train_ratio)
    assert int(state.env_steps) == 3072 and int(state.buffer.size) == 3072
    assert (metrics["imagined_length"] <= config.horizon).all()
    assert metrics["model_error_1step"][-1] < 0.05
    assert metrics["train_return"][-1] > 80, metrics["train_return"]  # a random policy averages about 22
