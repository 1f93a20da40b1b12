"""Probe environments: tiny tasks whose optimal value or policy is known in closed form.

A PPO that fails one of these has a specific bug (value regression, advantage
sign, credit assignment across steps, continuous log-probabilities), which a
learning curve on CartPole would only show as "learns slowly".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from rlx.envs.registry import import_env_module

environment = import_env_module("gymnax.environments.environment")
spaces = import_env_module("gymnax.environments.spaces")


@struct.dataclass
class ProbeState(environment.EnvState):
    obs: jax.Array
    time: int


@struct.dataclass
class ProbeParams(environment.EnvParams):
    max_steps_in_episode: int = 2


class Probe(environment.Environment):
    """Base class: a 2-dimensional observation, episodes of one or two steps."""

    num_steps = 1

    @property
    def default_params(self) -> ProbeParams:
        return ProbeParams(max_steps_in_episode=self.num_steps)

    def reset_env(self, key, params):
        obs = self.first_obs(key)
        return obs, ProbeState(obs=obs, time=0)

    def first_obs(self, key):
        return jnp.array([1.0, 0.0])

    def step_env(self, key, state, action, params):
        reward, next_obs = self.transition(state, action)
        time = state.time + 1
        terminated = time >= self.num_steps
        new_state = ProbeState(obs=next_obs, time=time)
        return next_obs, new_state, jnp.asarray(reward, jnp.float32), terminated, {}

    def transition(self, state, action):
        raise NotImplementedError

    def observation_space(self, params):
        return spaces.Box(-1.0, 1.0, (2,), jnp.float32)

    def action_space(self, params=None):
        return spaces.Discrete(2)


class ConstantReward(Probe):
    """Reward 1 every (one-step) episode: the value of the observation must be 1."""

    def transition(self, state, action):
        return 1.0, state.obs


class ObservationReward(Probe):
    """Observation is +1 or -1 at random and is the reward: the value must equal the observation."""

    def first_obs(self, key):
        sign = jnp.where(jax.random.bernoulli(key), 1.0, -1.0)
        return jnp.array([sign, 0.0])

    def transition(self, state, action):
        return state.obs[0], state.obs


class ActionReward(Probe):
    """Reward 1 for action 1, 0 for action 0: the policy must choose action 1."""

    def transition(self, state, action):
        return jnp.asarray(action == 1, jnp.float32), state.obs


class TwoStepCredit(Probe):
    """No reward on step one, reward 1 on step two: V(first obs) = gamma, V(second obs) = 1."""

    num_steps = 2

    def transition(self, state, action):
        reward = jnp.where(state.time == 1, 1.0, 0.0)
        return reward, jnp.array([0.0, 1.0])


class ContinuousTarget(Probe):
    """One continuous action; reward -(a - 0.5)^2: a Gaussian policy's mean must move to 0.5."""

    def transition(self, state, action):
        return -((action[0] - 0.5) ** 2), state.obs

    def action_space(self, params=None):
        return spaces.Box(-1.0, 1.0, (1,), jnp.float32)
