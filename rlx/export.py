"""Trained rlx policies outside JAX loops: a Gymnasium adapter.

    policy = GymnasiumPolicy("runs/ppo_cartpole/<time>")
    returns = gymnasium_returns(policy, "CartPole-v1", episodes=20)

The policy takes one NumPy observation and returns an action Gymnasium
accepts; ``reset()`` at each episode start clears a recurrent agent's memory.
"""

from __future__ import annotations

import numpy as np


class GymnasiumPolicy:
    """The policy of one seed (and sweep point: default the best) of a trained run, as ``obs -> action``."""

    def __init__(self, run_dir, seed: int = 0, point: int | None = None, greedy: bool = True, key_seed: int = 0):
        import jax

        from rlx.runner import components
        from rlx.runner.evaluation import stateful_act

        run = components.load_trained(run_dir)
        if point is None:
            point = best_point(run_dir)
        if not 0 <= seed < run.parts.settings.num_seeds:
            raise ValueError(f"seed={seed}: the run has seeds 0..{run.parts.settings.num_seeds - 1}")
        if not 0 <= point < run.parts.grid.size:  # jax would clamp an index out of range, silently
            raise ValueError(f"point={point}: the run has sweep points 0..{run.parts.grid.size - 1}")
        self.env_name = run.parts.env_name
        self.discrete = hasattr(run.parts.env.action_space(run.parts.env_params), "n")
        act, init_memory = stateful_act(run.agent(point))
        policy = run.policy(point, seed)

        def step(memory, obs, reset, key):  # one compiled call per step: the key split and batching included
            key, act_key = jax.random.split(key)
            memory, action = act(policy, memory, obs[None], reset[None], act_key, greedy)
            return memory, action[0], key

        self._act = jax.jit(step)
        self._init_memory = init_memory
        self._key = jax.random.PRNGKey(key_seed)
        self.reset()

    def reset(self) -> None:
        self._memory, self._starting = self._init_memory(1), True

    def __call__(self, obs):
        self._memory, action, self._key = self._act(self._memory, np.asarray(obs, np.float32),
                                                    np.array(self._starting), self._key)
        self._starting = False
        action = np.asarray(action)
        return int(action) if self.discrete else action.astype(np.float32)


def best_point(run_dir) -> int:
    """Index of the best sweep point in summary.json (0 when the run had no sweep or no summary)."""
    import json
    from pathlib import Path

    summary = Path(run_dir) / "summary.json"
    if not summary.exists():
        return 0
    return json.loads(summary.read_text()).get("sweep", {}).get("best", {}).get("index", 0)


def gymnasium_returns(policy: GymnasiumPolicy, env_id: str | None = None, episodes: int = 10, seed: int = 0):
    """Undiscounted returns of ``episodes`` Gymnasium episodes (env_id defaults to the run's environment)."""
    import gymnasium

    from rlx.errors import ConfigError

    try:
        env = gymnasium.make(env_id or policy.env_name)
    except gymnasium.error.Error as error:
        raise ConfigError(f"gymnasium={env_id or policy.env_name}: Gymnasium cannot make it ({error})") from None
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            policy.reset()
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy(obs))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return np.array(returns)
