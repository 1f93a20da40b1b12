"""Reference policies for single-agent environments (the gymnax API)."""

from __future__ import annotations

import jax

from rlx.baselines.multi_agent import ReferencePolicy


def uniform_policy(env, env_params) -> ReferencePolicy:
    """Uniformly random actions from the environment's action space (discrete or continuous), one per row.

    Shaped like an rlx agent for ``rlx.runner.evaluation.evaluate``: ``act(policy, obs, key, greedy)``
    on a batch of observations of any shape, ignoring ``policy`` and ``greedy``.
    """
    space = env.action_space(env_params)

    def act(policy, obs, key, greedy=False):
        return jax.vmap(space.sample)(jax.random.split(key, obs.shape[0]))

    return ReferencePolicy(act)
