"""GAE and value targets against a NumPy reference built from explicit discounted sums."""

import jax
import numpy as np
import pytest

from rlx.agents import ppo


def reference_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    """A_t = sum_l (gamma*lam)^l delta_{t+l}, the sum stopping at the end of t's episode."""
    steps, envs = rewards.shape
    done = np.logical_or(terminated, truncated)
    deltas = rewards + gamma * (1 - terminated) * next_values - values
    advantages = np.zeros_like(rewards)
    for n in range(envs):
        for t in range(steps):
            total, weight = 0.0, 1.0
            for k in range(t, steps):
                total += weight * deltas[k, n]
                if done[k, n]:
                    break
                weight *= gamma * lam
            advantages[t, n] = total
    return advantages, advantages + values


@pytest.mark.parametrize("jit", [False, True])
def test_gae_matches_reference_with_termination_and_truncation(jit):
    rng = np.random.default_rng(0)
    steps, envs = 12, 3
    rewards = rng.normal(size=(steps, envs)).astype(np.float32)
    values = rng.normal(size=(steps, envs)).astype(np.float32)
    next_values = rng.normal(size=(steps, envs)).astype(np.float32)
    terminated = np.zeros((steps, envs), np.float32)
    truncated = np.zeros((steps, envs), np.float32)
    terminated[3, 0] = terminated[7, 1] = 1  # natural ends
    truncated[5, 0] = truncated[2, 1] = truncated[9, 2] = 1  # time limits
    done = np.maximum(terminated, truncated)
    gae = jax.jit(ppo.gae) if jit else ppo.gae
    adv, targets = gae(rewards, values, next_values, terminated, done, 0.97, 0.9)
    ref_adv, ref_targets = reference_gae(rewards, values, next_values, terminated, truncated, 0.97, 0.9)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, ref_targets, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_and_termination_does_not():
    """One step, two envs, same reward: only the truncated one adds gamma * V(final obs)."""
    rewards = np.array([[1.0, 1.0]])
    values = np.zeros((1, 2))
    next_values = np.array([[10.0, 10.0]])
    terminated = np.array([[1.0, 0.0]])
    done = np.array([[1.0, 1.0]])
    adv, _ = ppo.gae(rewards, values, next_values, terminated, done, 0.5, 0.95)
    np.testing.assert_allclose(adv, [[1.0, 1.0 + 0.5 * 10.0]])


def test_discounted_return_when_lambda_is_one():
    """With lambda = 1 and zero values, targets are plain discounted returns within episodes."""
    rewards = np.array([[1.0], [2.0], [3.0], [4.0]])
    zeros = np.zeros_like(rewards)
    done = np.array([[0.0], [1.0], [0.0], [0.0]])
    _, targets = ppo.gae(rewards, zeros, zeros, done, done, 0.5, 1.0)
    np.testing.assert_allclose(targets[:, 0], [1 + 0.5 * 2, 2, 3 + 0.5 * 4, 4])
