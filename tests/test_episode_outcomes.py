"""Episode outcomes (SMAX's ``won``): evaluation reads each flag on the last counted step of an episode.

The test environments draw an episode length of 1, 2 or 3 steps at reset, pay 1 per step, and raise
``info["won"]`` on every step of a length-2 episode, not only its last. So an evaluation's return is
the first episode's length, and its win must be exactly "return == 2": a flag read on a step before
the end, from a later auto-reset episode, or from an episode the evaluation cut short breaks that.
"""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlx.envs.multi_agent import MultiAgentEnv, MultiAgentParams
from rlx.envs.registry import import_env_module
from rlx.runner.evaluation import evaluate_episodes
from rlx.runner.loop import final_evaluation, sweep_summary

environment = import_env_module("gymnax.environments.environment")
spaces = import_env_module("gymnax.environments.spaces")

NUM_EPISODES = 256


@struct.dataclass
class LengthState(environment.EnvState):
    length: jax.Array
    time: jax.Array


@struct.dataclass
class LengthParams(environment.EnvParams):
    max_steps_in_episode: int = 10


def draw_length(key):
    return LengthState(length=jax.random.randint(key, (), 1, 4), time=jnp.zeros((), jnp.int32))


def advance(state):
    state = state.replace(time=state.time + 1)
    return state, state.time >= state.length, {"won": state.length == 2}


class SingleAgentLengths(environment.Environment):
    episode_outcomes = ("won",)

    @property
    def default_params(self):
        return LengthParams()

    def reset_env(self, key, params):
        return jnp.zeros(1), draw_length(key)

    def step_env(self, key, state, action, params):
        state, terminated, info = advance(state)
        return jnp.zeros(1), state, jnp.float32(1.0), terminated, info

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (1,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)


class MultiAgentLengths(MultiAgentEnv):
    num_agents = 2
    episode_outcomes = ("won",)

    @property
    def default_params(self):
        return MultiAgentParams(max_steps_in_episode=10)

    def reset_env(self, key, params):
        return jnp.zeros((2, 1)), draw_length(key)

    def step_env(self, key, state, actions, params):
        state, terminated, info = advance(state)
        return jnp.zeros((2, 1)), state, jnp.ones(2), jnp.broadcast_to(terminated, (2,)), info

    def world_state(self, state, params):
        return jnp.zeros(2)

    def action_space(self, params):
        return spaces.Discrete(2)


# A policy-free agent: always action 0, one per agent for a multi-agent observation.
FIXED = SimpleNamespace(act=lambda policy, obs, key, greedy, mask=None: jnp.zeros(obs.shape[:-1], jnp.int32))


def outcomes_of(env, num_steps):
    run = jax.jit(lambda key: evaluate_episodes(FIXED, env, env.default_params, None, key, NUM_EPISODES, True,
                                                num_steps))
    returns, outcomes = jax.device_get(run(jax.random.PRNGKey(3)))
    return returns, outcomes


def test_win_is_read_on_the_last_step_of_the_first_episode_only():
    for env in (SingleAgentLengths(), MultiAgentLengths()):
        returns, outcomes = outcomes_of(env, num_steps=6)  # every first episode ends; later ones start
        assert set(outcomes) == {"won"} and outcomes["won"].shape == (NUM_EPISODES,)
        assert set(np.unique(returns)) == {1.0, 2.0, 3.0}, type(env).__name__
        np.testing.assert_array_equal(outcomes["won"], (returns == 2.0).astype(np.float32))


def test_episodes_cut_short_are_not_won():
    for env in (SingleAgentLengths(), MultiAgentLengths()):
        returns, outcomes = outcomes_of(env, num_steps=1)  # length-2 episodes raise the flag, unfinished
        np.testing.assert_array_equal(returns, np.ones(NUM_EPISODES))
        np.testing.assert_array_equal(outcomes["won"], np.zeros(NUM_EPISODES))


def test_environments_without_outcomes_report_none():
    from rlx.envs.coop import Coop

    env = Coop()
    returns, outcomes = evaluate_episodes(FIXED, env, env.default_params, None, jax.random.PRNGKey(0), 4, True)
    assert outcomes == {} and returns.shape == (4,)


def test_summary_figures_are_shares_of_episodes_per_seed():
    settings = SimpleNamespace(eval_episodes=4, eval_greedy=True)
    returns = np.array([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0]])  # [seed, episode]
    won = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    figures = final_evaluation(returns, settings, {"won": won})
    assert figures["won_per_seed"] == [0.75, 0.25] and figures["won_mean"] == 0.5
    assert figures["return_per_seed"] == [2.5, 0.0]

    grid = SimpleNamespace(fields=["algo.lr"], points=[{"algo.lr": 1e-3}, {"algo.lr": 1e-4}])
    sweep = sweep_summary(grid, np.stack([returns, returns[::-1]]), settings, {"won": np.stack([won, won[::-1]])})
    assert [p["won_per_seed"] for p in sweep["points"]] == [[0.75, 0.25], [0.25, 0.75]]
