"""Offline preference datasets (rlx/pbrl/datasets.py): a tiny CartPole set made from one short PPO run,
its file format, the oracle's labels, the replay mix, load errors, and the offline study's plumbing."""

import json

import numpy as np
import pytest

from rlx.agents import cpl
from rlx.pbrl import datasets, offline_study

TINY = dict(num_segments=48, num_pairs=96, segment_length=10, ppo_timesteps=5120, replay_policies=3,
            collect_envs=4, eval_episodes=4)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    cache = tmp_path_factory.mktemp("datasets")
    paths = datasets.make_datasets("cartpole", cache_dir=cache, quick=True, **TINY)
    return cache, paths


def test_every_level_round_trips_through_its_file(made):
    cache, paths = made
    assert set(paths) == set(datasets.LEVELS)
    for level, path in paths.items():
        assert path.parent == cache and path.suffix == ".npz"
        loaded = datasets.load_dataset(path)
        assert loaded["env"] == "CartPole-v1" and loaded["level"] == level
        assert loaded["obs"].shape == (48, 10, 4) and loaded["obs"].dtype == np.float32
        assert loaded["actions"].shape == (48, 10) and loaded["actions"].dtype == np.int32
        assert loaded["pairs"].shape == (96, 2) and (loaded["pairs"][:, 0] != loaded["pairs"][:, 1]).all()
        assert set(np.unique(loaded["labels"])) <= {0.0, 0.5, 1.0} and (loaded["mask"] == 1).all()
        assert json.loads(str(np.load(path)["settings"]))["num_segments"] == 48
        with np.load(path) as raw:  # what is on disk is what load_dataset returns
            for name in ("obs", "actions", "rewards", "pairs", "labels", "mask", "terminals"):
                np.testing.assert_array_equal(raw[name], loaded[name])
        data = datasets.to_agent_data(loaded)
        cpl.check_data(data, False, (4,), 2)


def test_cached_files_are_reused_not_regenerated(made):
    cache, paths = made
    stamps = {level: path.stat().st_mtime_ns for level, path in paths.items()}
    again = datasets.make_datasets("cartpole", cache_dir=cache, quick=True, **TINY)
    assert again == paths and {level: p.stat().st_mtime_ns for level, p in again.items()} == stamps
    # different settings -> a different file name (the settings hash is part of it)
    changed = datasets.dataset_path(cache, datasets.default_settings("cartpole", True, **{**TINY, "num_pairs": 97}),
                                    "random")
    assert changed != paths["random"]


def test_a_level_made_alone_holds_what_its_file_name_promises(made, tmp_path):
    """The file name carries the settings, not which other levels were missing: making one level alone (the
    expert from one policy; then the replay mix) gives the same data as making all four at once."""
    _, paths = made
    for level in ("expert", "replay"):
        alone = datasets.make_datasets("cartpole", levels=(level,), cache_dir=tmp_path / level, quick=True, **TINY)
        assert alone[level].name == paths[level].name
        made_alone, made_together = datasets.load_dataset(alone[level]), datasets.load_dataset(paths[level])
        for name in ("obs", "actions", "rewards", "pairs", "labels", "source"):
            np.testing.assert_array_equal(made_alone[name], made_together[name], err_msg=f"{level}: {name}")


def test_oracle_labels_agree_with_summed_rewards_and_the_terminal_penalty(made):
    _, paths = made
    seen = set()
    for path in paths.values():
        d = datasets.load_dataset(path)
        assert d["terminal_penalty"] == 1.0
        teacher = d["rewards"].sum(-1) - d["terminal_penalty"] * d["terminals"].sum(-1)
        r0, r1 = teacher[d["pairs"][:, 0]], teacher[d["pairs"][:, 1]]
        expected = np.where(r1 > r0, 1.0, np.where(r1 < r0, 0.0, 0.5))
        np.testing.assert_array_equal(d["labels"], expected)
        # CartPole pays 1 per step, falls included: only the penalty separates segments
        assert (d["rewards"] == 1.0).all()
        seen |= set(np.unique(d["labels"]).tolist())
    assert {0.0, 1.0} <= seen  # the random data has falls, so some pairs are decided


def test_oracle_labels_helper_on_a_hand_example():
    rewards = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.5, 0.0]])
    terminals = np.array([[0, 0, 0], [0, 1, 0], [0, 0, 0]], np.float32)
    pairs = np.array([[0, 1], [1, 0], [0, 0], [2, 1]])
    np.testing.assert_array_equal(datasets.oracle_labels(rewards, terminals, pairs, 1.0), [0.0, 1.0, 0.5, 1.0])
    np.testing.assert_array_equal(datasets.oracle_labels(rewards, terminals, pairs, 0.0), [0.5, 0.5, 0.5, 1.0])


def test_levels_come_from_the_right_policies_and_replay_mixes_them(made):
    _, paths = made
    d = {level: datasets.load_dataset(path) for level, path in paths.items()}
    updates = {level: d[level]["source_updates"] for level in datasets.LEVELS}
    assert updates["random"].tolist() == [0]
    assert 0 < updates["medium"][0] < updates["expert"][0]
    replay = d["replay"]
    assert {0, int(updates["medium"][0]), int(updates["expert"][0])} <= set(replay["source_updates"].tolist())
    counts = np.bincount(replay["source"], minlength=len(replay["source_updates"]))
    assert (counts > 0).all() and counts.max() - counts.min() <= 1  # equal shares
    for level in ("random", "medium", "expert"):
        assert (d[level]["source"] == 0).all()
    # the replay segments of the untrained policy are some of that policy's rollout, not copies of one segment
    assert len(np.unique(replay["obs"][replay["source"] == 0].reshape(-1, 4), axis=0)) > 10


def write(path, arrays):
    np.savez(path, **arrays)
    return path


def good_arrays():
    rng = np.random.default_rng(0)
    return dict(obs=rng.normal(size=(5, 3, 4)).astype(np.float32), actions=rng.integers(0, 2, (5, 3)),
                rewards=np.ones((5, 3), np.float32), pairs=np.array([[0, 1], [2, 3], [4, 0]]),
                labels=np.array([0.0, 0.5, 1.0]), mask=np.array([1.0, 1.0, 0.0]), env=np.array("CartPole-v1"),
                level=np.array("mine"))


def test_a_dataset_of_your_own_loads_with_defaults(tmp_path):
    loaded = datasets.load_dataset(write(tmp_path / "own.npz", good_arrays()))
    assert loaded["terminals"].shape == (5, 3) and not loaded["terminals"].any()
    assert loaded["terminal_penalty"] == 0.0 and loaded["level"] == "mine"
    assert datasets.summary(loaded)["skipped"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("field, change", [
    ("labels", lambda a: a.pop("labels")),
    ("env", lambda a: a.pop("env")),
    ("labels", lambda a: a.update(labels=np.array([0.0, 1.0]))),
    ("labels", lambda a: a.update(labels=np.array([0.0, 2.0, 1.0]))),
    ("mask", lambda a: a.update(mask=np.array([1.0, 0.5, 1.0]))),
    ("pairs", lambda a: a.update(pairs=np.array([[0, 1], [2, 3], [4, 5]]))),
    ("pairs", lambda a: a.update(pairs=np.array([0, 1, 2]))),
    ("actions", lambda a: a.update(actions=np.zeros((5, 2), np.int64))),
    ("actions", lambda a: a.update(actions=np.zeros((5, 3), np.float32))),
    ("rewards", lambda a: a.update(rewards=np.ones((5, 4)))),
    ("obs", lambda a: a.update(obs=np.full((5, 3, 4), np.nan))),
    ("terminals", lambda a: a.update(terminals=np.zeros(5))),
    ("terminals", lambda a: a.update(terminals=np.full((5, 3), np.nan))),
    ("terminal_penalty", lambda a: a.update(terminal_penalty=np.array([1.0, 2.0]))),
    ("level", lambda a: a.update(level=np.array([1, 2]))),
    ("pairs", lambda a: a.update(pairs=np.array([[0, 1], [2, 2], [4, 0]]))),
    ("terminals", lambda a: a.update(terminals=np.full((5, 3), 0.5))),
    ("source", lambda a: a.update(source=np.array([0, 1, -1, 0, 1]), source_updates=np.array([1, 2]))),
    ("source", lambda a: a.update(source=np.zeros(5, np.float32))),
])
def test_load_errors_name_the_file_and_the_field(tmp_path, field, change):
    arrays = good_arrays()
    change(arrays)
    path = write(tmp_path / "bad.npz", arrays)
    with pytest.raises(datasets.DatasetError) as error:
        datasets.load_dataset(path)
    assert str(path) in str(error.value) and f"'{field}'" in str(error.value), str(error.value)


def test_env_and_level_stored_as_bytes_read_as_text(tmp_path):
    """NumPy "S" strings (h5py's) used to come back as "np.bytes_(b'CartPole-v1')"."""
    loaded = datasets.load_dataset(write(tmp_path / "bytes.npz", {**good_arrays(), "env": np.array(b"CartPole-v1"),
                                                                  "level": np.array(b"mine")}))
    assert (loaded["env"], loaded["level"]) == ("CartPole-v1", "mine")


def test_missing_and_unreadable_files_are_named(tmp_path):
    with pytest.raises(datasets.DatasetError, match="no such dataset file"):
        datasets.load_dataset(tmp_path / "absent.npz")
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(datasets.DatasetError, match=r"text\.npz: cannot read"):
        datasets.load_dataset(tmp_path / "text.npz")
    whole = write(tmp_path / "whole.npz", good_arrays()).read_bytes()
    (tmp_path / "cut.npz").write_bytes(whole[: len(whole) // 2])  # a copy that stopped halfway
    with pytest.raises(datasets.DatasetError, match=r"cut\.npz: cannot read"):
        datasets.load_dataset(tmp_path / "cut.npz")


def test_unknown_env_and_level_list_the_valid_names(tmp_path):
    with pytest.raises(ValueError, match="cartpole"):
        datasets.make_datasets("hopper", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="replay"):
        datasets.make_datasets("cartpole", levels=("awful",), cache_dir=tmp_path)


def test_offline_study_quick_writes_its_tables(made, tmp_path):
    cache, _ = made
    result = offline_study.run_study(tmp_path, envs=("cartpole",), levels=("random", "replay"), seeds=2, quick=True,
                                     cache_dir=cache, num_updates=10, eval_episodes=2, dataset_settings=TINY)
    assert len(result["rows"]) == 2 * len(offline_study.METHODS)
    table = (tmp_path / "offline_quick.md").read_text()
    assert "| CartPole-v1 | replay |" in table and "BC (preferred)" in table and "QUICK" in table
    stored = json.loads((tmp_path / "offline_quick.json").read_text())
    for row in stored["rows"]:
        assert len(row["per_seed"]) == 2 and np.isfinite(row["mean"]) and row["behaviour_return"] is not None


def test_the_cache_key_covers_the_ppo_preset_and_the_generator(monkeypatch):
    """A cached dataset made with other PPO settings, expert threshold or generator code used to be reused."""
    import dataclasses

    settings = datasets.default_settings("cartpole")
    before = settings.key()
    preset = datasets.ENVS["cartpole"]
    monkeypatch.setitem(datasets.ENVS, "cartpole", dataclasses.replace(preset, ppo={**preset.ppo, "lr": 1.0}))
    assert settings.key() != before
    monkeypatch.setitem(datasets.ENVS, "cartpole", dataclasses.replace(preset, expert_min_return=0.0))
    assert settings.key() != before
    monkeypatch.setitem(datasets.ENVS, "cartpole", preset)
    monkeypatch.setattr(datasets, "GENERATOR_VERSION", datasets.GENERATOR_VERSION + 1)
    assert settings.key() != before
