"""PPO's policy distributions against SciPy and NumPy references."""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from rlx.agents import ppo


def test_categorical_log_prob_entropy_mode_and_sampling():
    logits = np.array([[0.5, -1.0, 2.0], [0.0, 0.0, 0.0]], np.float32)
    dist = ppo.Categorical(jnp.asarray(logits))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    actions = np.array([2, 1])
    np.testing.assert_allclose(dist.log_prob(jnp.asarray(actions)), np.log(probs[[0, 1], actions]), rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(), [stats.entropy(p) for p in probs], rtol=1e-5)
    np.testing.assert_array_equal(dist.mode(), [2, 0])
    samples = jax.vmap(lambda k: dist.sample(k))(jax.random.split(jax.random.PRNGKey(0), 20000))
    frequencies = np.stack([(np.asarray(samples)[:, i, None] == np.arange(3)).mean(0) for i in range(2)])
    np.testing.assert_allclose(frequencies, probs, atol=0.015)


def test_diagonal_gaussian_matches_scipy():
    mean = np.array([[0.5, -1.0]], np.float32)
    log_std = np.array([[0.0, np.log(0.3)]], np.float32)
    dist = ppo.DiagGaussian(jnp.asarray(mean), jnp.asarray(log_std))
    action = np.array([[1.0, -0.8]], np.float32)
    expected = stats.norm(mean, np.exp(log_std)).logpdf(action).sum(-1)
    np.testing.assert_allclose(dist.log_prob(jnp.asarray(action)), expected, rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(), stats.norm(mean, np.exp(log_std)).entropy().sum(-1), rtol=1e-5)
    samples = np.asarray(jax.vmap(dist.sample)(jax.random.split(jax.random.PRNGKey(1), 20000)))
    np.testing.assert_allclose(samples.mean(0), mean, atol=0.03)
    np.testing.assert_allclose(samples.std(0), np.exp(log_std), atol=0.03)
