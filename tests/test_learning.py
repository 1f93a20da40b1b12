"""The CartPole preset solves its task: mean greedy evaluation return >= 475 over its 4 seeds."""

import json

import pytest

from rlx.envs import registry


def test_ppo_cartpole_preset_reaches_475(run_cli, tmp_path):
    done = run_cli("+exp=ppo_cartpole", "logger=none", full_opt=True)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_seeds"] == 4
    assert summary["final_eval"]["return_mean"] >= 475, summary["final_eval"]


def test_registry_lists_valid_names_for_unknown_env():
    try:
        registry.make("CartPole-v0")
    except ValueError as error:
        assert f"unknown env 'CartPole-v0'; valid: {', '.join(sorted(registry.ENVIRONMENTS))}" == str(error)
        assert "CartPole-v1" in registry.ENVIRONMENTS and "Acrobot-v1" in registry.ENVIRONMENTS
    else:
        raise AssertionError("no error for an unknown environment")


def test_every_registered_single_agent_gymnax_environment_steps():
    """Brax and the multi-agent environments have their own tests (test_envs_suites, test_jaxmarl,
    test_multi_agent_env, test_mapf_env, test_market_book)."""
    import jax

    for name in registry.names():
        if registry.ENVIRONMENTS[name][0] in (*registry.OPTIONAL_PACKAGES, "rlx.envs.mapf", "rlx.envs.market.book"):
            continue
        env, params = registry.make(name)
        if hasattr(env, "num_agents"):  # multi-agent: tests/test_multi_agent_env.py
            continue
        obs, state = env.reset(jax.random.PRNGKey(0), params)
        action = env.action_space(params).sample(jax.random.PRNGKey(1))
        out = env.step(jax.random.PRNGKey(2), state, action, params)
        assert len(out) == 6 and out[0].shape == obs.shape, name


@pytest.mark.slow
@pytest.mark.parametrize("preset, threshold", [("ppo_acrobot", -100.0), ("ppo_pendulum", -250.0),
                                               ("ppo_rnn_memory", 0.9)])
def test_slow_presets_reach_their_thresholds(run_cli, tmp_path, preset, threshold):
    done = run_cli(f"+exp={preset}", "logger=none", timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["final_eval"]["return_mean"] >= threshold, summary["final_eval"]
