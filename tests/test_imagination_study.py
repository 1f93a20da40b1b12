"""The sample-efficiency study (rlx/imagination/sample_efficiency.py): its step counting and its presets."""

import math

import numpy as np

from rlx.imagination import sample_efficiency as study


def test_steps_to_target_first_touch_and_staying():
    steps = [1000, 2000, 3000, 4000]
    returns = np.array([[100, 480, 500],  # one column per seed
                        [480, 470, 500],
                        [200, 490, 500],
                        [490, 490, 100]]).astype(float)
    first, stays = study.steps_to_target(steps, returns, 475.0)
    assert first == [2000, 1000, 1000]
    assert stays == [4000, 3000, None]  # seed 2 falls back below at the last evaluation


def test_median_counts_a_seed_that_never_arrives_as_infinite():
    assert study.median_steps([1000, 3000, None]) == 3000
    assert math.isinf(study.median_steps([None, None, 1000]))


def test_presets_are_read_as_rlx_train_reads_them():
    module, config, env, params = study.preset_parts("dyna_ppo_cartpole")
    assert module.__name__ == "rlx.agents.dyna_ppo"
    assert config.total_timesteps == 20480 and config.hidden_sizes == (64, 64)
    _, ppo_config, _, _ = study.preset_parts("ppo_cartpole", ("algo.num_envs=4",))
    assert ppo_config.num_envs == 4 and ppo_config.hidden_sizes == config.hidden_sizes  # same network sizes


def test_table_names_the_ratio_and_the_target():
    row = lambda first, stays: {"preset": "p", "budget": 8192, "first": first, "returns": [[500.0, 500.0]],  # noqa: E731
                                "median_first": study.median_steps(first), "median_settled": study.median_steps(stays),
                                "train_seconds": 1.0, "compile_seconds": 2.0}
    results = {"CartPole-v1": {"dyna_ppo": row([1024, 2048], [2048, 2048]),
                               "PPO (model-free)": row([4096, 8192], [8192, 16384])}}
    table = study.markdown(results, 2, quick=False)
    assert "first 0.25, stays 0.17" in table and "HOLDS for reaching 475 to stay" in table
    assert "| dyna_ppo | `p` | 8.2k | 1.5k / 2.0k | 1.0k, 2.0k |" in table
