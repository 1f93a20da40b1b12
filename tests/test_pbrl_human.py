"""Training on a human's label file (algo.teacher=file): rlx/pbrl/human.py and pref_ppo's given labels."""

import json

import jax
import numpy as np
import pytest
from gymnax.environments.classic_control.cartpole import CartPole

from rlx.agents import pref_ppo as P
from rlx.errors import ConfigError
from rlx.pbrl import human
from rlx.pbrl.labels import append_label
from rlx.pbrl.queries import make_queries, save_queries


def upright_answer(queries, left, right):
    """A scripted stand-in for a person watching CartPole clips: the pole that leans less is better."""
    lean = [np.abs(queries["obs"][i][:, 2]).max() for i in (left, right)]
    return "left" if lean[0] < lean[1] else "right"


@pytest.fixture(scope="module")
def label_dir(tmp_path_factory):
    """A labelling directory: 120 CartPole pairs of a random policy, 100 answered (one skip, one tie)."""
    directory = tmp_path_factory.mktemp("labels")
    queries = make_queries("CartPole-v1", 120, 16, 0, num_envs=16, num_steps=64)
    save_queries(directory / "queries.npz", queries)
    ids = queries["segment_ids"]
    for query, (left, right) in enumerate(queries["pairs"][:100]):
        answer = {7: "skip", 8: "equal"}.get(query) or upright_answer(queries, left, right)
        append_label(directory / "labels.jsonl", query, ids[left], ids[right], answer)
    return directory, queries


def test_given_labels_are_the_answered_pairs_in_order(label_dir):
    directory, queries = label_dir
    arrays = human.given_labels(directory, "CartPole-v1")
    assert arrays["obs0"].shape == (100, 16, 4) and arrays["action1"].shape == (100, 16)
    left, right = queries["pairs"][:100].T
    np.testing.assert_array_equal(arrays["obs0"], queries["obs"][left])
    np.testing.assert_array_equal(arrays["action1"], queries["action"][right])
    np.testing.assert_array_equal(arrays["absorbing0"], queries["absorbing"][left])
    np.testing.assert_array_equal(arrays["absorbing1"], queries["absorbing"][right])
    assert arrays["absorbing0"].any()  # random-policy clips of 16 steps often fall part-way
    assert arrays["mask"][7] == 0 and arrays["mask"].sum() == 99
    assert arrays["label"][8] == 0.5
    expected = [1.0 if upright_answer(queries, a, b) == "right" else 0.0 for a, b in queries["pairs"][:100]]
    keep = [q for q in range(100) if q not in (7, 8)]
    np.testing.assert_array_equal(arrays["label"][keep], np.asarray(expected)[keep])


def test_bind_sets_the_budget_and_rejects_bad_combinations(label_dir):
    directory, _ = label_dir
    values = {"teacher": "file", "label_dir": str(directory), "queries_per_feedback": 10}
    view = human.bind(P, values, "CartPole-v1")
    assert values == {"teacher": "file", "budget": 100, "queries_per_feedback": 10}
    assert view.make.keywords["given_labels"].label.shape == (100,) and view.Config is P.Config
    with pytest.raises(ConfigError, match="required with algo.teacher=file"):
        human.bind(P, {"teacher": "file"}, "CartPole-v1")
    with pytest.raises(ConfigError, match="only read with algo.teacher=file"):
        human.bind(P, {"teacher": "oracle", "label_dir": str(directory)}, "CartPole-v1")
    with pytest.raises(ConfigError, match="holds CartPole-v1 segments, but this run trains on Acrobot-v1"):
        human.bind(P, {"teacher": "file", "label_dir": str(directory)}, "Acrobot-v1")
    assert human.bind(P, {"teacher": "oracle"}, "CartPole-v1") is P


def test_label_files_that_do_not_match_the_queries_name_the_line(label_dir, tmp_path):
    directory, queries = label_dir
    (tmp_path / "queries.npz").write_bytes((directory / "queries.npz").read_bytes())
    ids = queries["segment_ids"]
    left, right = queries["pairs"][3]
    with (tmp_path / "labels.jsonl").open("w") as handle:
        handle.write("\n\n")  # blank lines count: the error names the answer's line in the file
    append_label(tmp_path / "labels.jsonl", 0, ids[left], ids[right], "left")  # query 0 is another pair
    with pytest.raises(ConfigError, match=r"labels.jsonl, line 3: query 0 is not the pair"):
        human.given_labels(tmp_path)
    (tmp_path / "labels.jsonl").write_text(json.dumps({"query": 0, "left": "nope", "right": ids[0],
                                                       "answer": "left"}) + "\n")
    with pytest.raises(ConfigError, match=r"line 1: unknown left segment id 'nope'"):
        human.given_labels(tmp_path)
    (tmp_path / "labels.jsonl").write_text("")
    with pytest.raises(ConfigError, match="has no answers yet"):
        human.given_labels(tmp_path)


def test_given_labels_need_the_file_teacher_and_a_matching_budget(label_dir):
    arrays = P.GivenLabels(**human.given_labels(label_dir[0]))
    env = CartPole()
    with pytest.raises(ValueError, match="teacher='file' needs given_labels"):
        P.make(P.cartpole_config(teacher="file", budget=100), env, env.default_params)
    with pytest.raises(ValueError, match="budget=60: must equal the number of given labels"):
        P.make(P.cartpole_config(teacher="file", budget=60), env, env.default_params, given_labels=arrays)


def test_train_config_binds_the_label_file(label_dir):
    """``algo.teacher=file algo.label_dir=DIR`` reaches pref_ppo.make through rlx.runner.components."""
    from hydra import compose, initialize_config_dir

    from rlx.runner import components
    from rlx.train import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", ["+exp=pref_ppo_cartpole", "logger=none", "algo.teacher=file",
                                 f"algo.label_dir={label_dir[0]}"])
        parts = components.build(cfg)
        assert parts.grid.configs[0].budget == 100 and parts.grid.configs[0].teacher == "file"
        assert parts.agent_module.make.keywords["given_labels"].label.shape == (100,)
        with pytest.raises(ConfigError, match="algo.label_dir: required with algo.teacher=file"):
            components.build(compose("config", ["+exp=pref_ppo_cartpole", "algo.teacher=file"]))


def test_cartpole_learns_from_the_label_file_alone(label_dir, optimised):
    """100 answers about a random policy's clips, no scripted teacher: the pole is balanced far longer."""
    arrays = P.GivenLabels(**human.given_labels(label_dir[0]))
    env = CartPole()
    # half the preset's budget, with rescaled rewards and 50 reward-model steps of 32 pairs per round
    config = P.cartpole_config(teacher="file", budget=100, total_timesteps=61440, reward_steps=50,
                               reward_batch_size=32, normalize_rewards=True)
    agent = P.make(config, env, env.default_params, given_labels=arrays)

    def run(key):
        state = agent.init(key)
        state, metrics = jax.lax.scan(agent.update, state, jax.numpy.arange(config.num_updates))
        return metrics

    metrics = jax.jit(jax.vmap(run))(jax.random.split(jax.random.PRNGKey(0), 2))
    assert np.all(np.asarray(metrics["labels_used"]) == 100)  # the file's labels, none asked
    # sampled training episodes (the greedy policy does better): a random policy averages about 22
    assert np.all(np.asarray(metrics["train_return"])[:, -5:].mean(1) > 80), metrics["train_return"][:, -5:]


@pytest.mark.parametrize("overrides,message", [
    (["algo.budget=5"], "algo.budget=5: budget smaller than one batch (queries_per_feedback)"),
    (["algo.segment_length=640", "algo.num_steps=640"], "algo.segment_length=640: longer than an episode "
                                                         "(max_steps_in_episode=500)"),
])
def test_bad_preference_settings_fail_before_compiling_naming_the_field(overrides, message):
    from hydra import compose, initialize_config_dir

    from rlx.runner import components
    from rlx.train import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        with pytest.raises(ConfigError) as error:
            components.build(compose("config", ["+exp=pref_ppo_cartpole", *overrides]))
    assert str(error.value) == message
