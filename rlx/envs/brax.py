"""Brax physics environments behind the gymnax 1.0 API.

``BraxEnv("halfcheetah")`` wraps ``brax.envs.get_environment(name, backend=...)``
so rlx agents train on it like on any gymnax environment:

* ``reset(key, params) -> (obs, state)`` and
  ``step(key, state, action, params) -> (obs, state, reward, terminated, truncated, info)``
  with auto-reset (gymnax's ``Environment.step``): a fresh ``reset`` with the
  step's own key replaces the state when the episode ends, and
  ``info["final_observation"]`` keeps the observation before the reset.
* ``terminated`` is brax's ``done`` (the hopper falls, the pendulum tips over);
  ``truncated`` is the time limit ``params.max_steps_in_episode`` (default 1000,
  brax's usual episode length), so agents bootstrap the value at the limit.
* Actions are in ``[-1, 1]`` (brax scales them to the actuators' ranges);
  observations are float32 vectors.

Brax (with MuJoCo) is an optional dependency: ``pip install -e .[brax]``.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from rlx.envs.registry import import_env_module, init_keywords

environment = import_env_module("gymnax.environments.environment")
spaces = import_env_module("gymnax.environments.spaces")

# Physics pipeline unless the caller names another ("positional", "generalized",
# "mjx"). "spring" compiles about as fast as the others and steps fastest on CPU.
DEFAULT_BACKEND = "spring"


def load_brax_envs():
    """``brax.envs``; a one-line error if brax is not installed.

    mujoco.mjx prints two lines about its optional "warp" GPU backend on import and
    jaxopt (a brax dependency) warns that it is unmaintained; both are swallowed here
    (environments never print).
    """
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="JAXopt is no longer maintained")
            import brax.envs
    except ImportError as error:
        from rlx.errors import ConfigError

        raise ConfigError("brax is not installed; pip install -e .[brax]") from error
    return brax.envs


@contextlib.contextmanager
def quiet_mujoco():
    """Silence what loading brax's MJCF assets prints: MuJoCo's deprecation notice for
    ``settotalmass`` in brax's half_cheetah.xml and brax's "not actively maintained" warning."""
    import mujoco

    previous = mujoco.get_mju_user_warning()
    mujoco.set_mju_user_warning(lambda message: None)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Brax System, piplines and environments")
            yield
    finally:
        mujoco.set_mju_user_warning(previous)


@struct.dataclass
class EnvState(environment.EnvState):
    brax_state: Any  # brax.envs.State: pipeline state, obs, reward, done, metrics, info


@struct.dataclass
class EnvParams(environment.EnvParams):
    max_steps_in_episode: int = 1000


def forwarded_options(env_name: str) -> list[str]:
    """The options ``BraxEnv(env_name, **options)`` passes on to the brax environment's constructor."""
    return [option for option in init_keywords(load_brax_envs()._envs[env_name])
            if option not in ("backend", "sys")]  # BraxEnv passes backend; each environment builds its own sys


class BraxEnv(environment.Environment):
    """One brax environment (``ant``, ``halfcheetah``, ``hopper``, ...) as a gymnax ``Environment``.

    ``kwargs`` go to the brax environment's constructor, e.g.
    ``BraxEnv("hopper", terminate_when_unhealthy=False)``.
    """

    def __init__(self, env_name: str, backend: str = DEFAULT_BACKEND, **kwargs):
        super().__init__()
        self.brax_name, self.backend = env_name, backend
        envs = load_brax_envs()
        with quiet_mujoco():
            self.brax_env = envs.get_environment(env_name, backend=backend, **kwargs)
        obs = jax.eval_shape(self.brax_env.reset, jax.random.PRNGKey(0)).obs
        self.obs_shape = tuple(obs.shape)
        self.action_size = int(self.brax_env.action_size)

    @property
    def default_params(self) -> EnvParams:
        return EnvParams()

    def reset_env(self, key, params):
        brax_state = self._canonical(self.brax_env.reset(key))
        return brax_state.obs, EnvState(time=0, brax_state=brax_state)

    def step_env(self, key, state, action, params):
        brax_state = self._canonical(self.brax_env.step(state.brax_state, action))
        new_state = EnvState(time=state.time + 1, brax_state=brax_state)
        terminated = brax_state.done > 0.5
        return brax_state.obs, new_state, brax_state.reward, terminated, dict(brax_state.metrics)

    @staticmethod
    def _canonical(brax_state):
        """float32 arrays for reward and done: some brax envs return Python floats from ``step``,
        and auto-reset selects leaf by leaf between the stepped and the reset state."""
        return brax_state.replace(
            obs=jnp.asarray(brax_state.obs, jnp.float32),
            reward=jnp.asarray(brax_state.reward, jnp.float32),
            done=jnp.asarray(brax_state.done, jnp.float32),
        )

    def observation_space(self, params=None):
        return spaces.Box(-jnp.inf, jnp.inf, self.obs_shape, jnp.float32)

    def action_space(self, params=None):
        return spaces.Box(-1.0, 1.0, (self.action_size,), jnp.float32)

    @property
    def name(self) -> str:
        return f"brax-{self.brax_name}"

    @property
    def num_actions(self) -> int:
        return self.action_size
