"""The queries file: segments and pairs from a rollout, a save/load round trip, one clear error per bad field."""

import numpy as np
import pytest

from rlx.pbrl.queries import (FIELDS, OPTIONAL_FIELDS, QueryFileError, after_termination, draw_pairs,
                              known_segment_ids, load_queries, make_queries, save_queries)


@pytest.fixture(scope="module")
def cartpole():
    return make_queries("CartPole-v1", num_pairs=10, segment_length=10, key_seed=0, num_envs=2, num_steps=30)


def test_cartpole_segments_are_env_major_with_ids_and_distinct_pairs(cartpole):
    assert cartpole["segment_ids"].tolist() == ["e0-t0", "e0-t10", "e0-t20", "e1-t0", "e1-t10", "e1-t20"]
    assert cartpole["obs"].shape == (6, 10, 4) and cartpole["obs"].dtype == np.float32
    assert cartpole["action"].shape == (6, 10) and cartpole["action"].dtype == np.int32
    assert set(np.unique(cartpole["action"])) <= {0, 1}
    np.testing.assert_array_equal(cartpole["reward"], np.ones((6, 10), np.float32))  # CartPole: 1 per step
    pairs = cartpole["pairs"]
    assert pairs.shape == (10, 2) and pairs.dtype == np.int32
    assert (pairs[:, 0] != pairs[:, 1]).all() and len({tuple(sorted(p)) for p in pairs.tolist()}) == 10
    assert str(cartpole["env"]) == "CartPole-v1" and cartpole["env"].shape == ()
    assert known_segment_ids(cartpole) == set(cartpole["segment_ids"].tolist())


def test_steps_after_a_termination_are_marked_absorbing():
    np.testing.assert_array_equal(after_termination([[0, 1, 0, 1, 0], [0, 0, 0, 0, 1], [1, 0, 0, 0, 0]]),
                                  [[0, 0, 1, 1, 1], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]])
    # a random CartPole policy falls within about 20 steps: segments of 50 hold falls
    queries = make_queries("CartPole-v1", num_pairs=3, segment_length=50, key_seed=0, num_envs=2, num_steps=100)
    absorbing = queries["absorbing"]
    assert absorbing.shape == (4, 50) and absorbing.dtype == np.float32
    assert absorbing.any(axis=1).all() and (absorbing[:, 0] == 0).all() and (np.diff(absorbing, axis=1) >= 0).all()


def test_continuous_actions_and_a_given_policy():
    queries = make_queries("Pendulum-v1", num_pairs=3, segment_length=5, key_seed=1, num_envs=2, num_steps=10,
                           policy=lambda obs, key: obs[:1] * 0.0 + 0.5)
    assert queries["action"].shape == (4, 5, 1) and queries["action"].dtype == np.float32
    np.testing.assert_allclose(queries["action"], 0.5)
    np.testing.assert_allclose(np.linalg.norm(queries["obs"][..., :2], axis=-1), 1.0, atol=1e-5)  # cos, sin


def test_impossible_requests_are_refused_clearly():
    with pytest.raises(ValueError, match=r"segment_length=300: must be in \[1, 200\]"):
        make_queries("Pendulum-v1", num_pairs=1, segment_length=300, key_seed=0)
    with pytest.raises(ValueError, match=r"num_pairs=7: must be in \[1, 6\].* among 4"):
        make_queries("Pendulum-v1", num_pairs=7, segment_length=5, key_seed=0, num_envs=2, num_steps=10)


def test_every_pair_can_be_drawn():
    for segments in (2, 5, 40):
        possible = segments * (segments - 1) // 2
        pairs = draw_pairs(segments, possible, seed=3)
        assert len({tuple(sorted(p)) for p in pairs.tolist()}) == possible and pairs.min() >= 0
        assert pairs.max() < segments and (pairs[:, 0] != pairs[:, 1]).all()


def test_round_trip(cartpole, tmp_path):
    save_queries(tmp_path / "queries.npz", cartpole)
    loaded = load_queries(tmp_path / "queries.npz")
    assert set(loaded) == set(FIELDS + OPTIONAL_FIELDS)
    for field in FIELDS + OPTIONAL_FIELDS:
        np.testing.assert_array_equal(loaded[field], cartpole[field])
        assert loaded[field].dtype == cartpole[field].dtype


def test_a_file_without_absorbing_flags_loads_with_none_set(cartpole, tmp_path):
    save_queries(tmp_path / "queries.npz", {field: cartpole[field] for field in FIELDS})
    loaded = load_queries(tmp_path / "queries.npz")
    np.testing.assert_array_equal(loaded["absorbing"], np.zeros((6, 10), np.float32))


def broken(queries, field, value):
    return {**queries, field: value} if value is not None else {k: v for k, v in queries.items() if k != field}


@pytest.mark.parametrize("field, make_value, message", [
    ("reward", lambda q: None, "missing"),
    ("obs", lambda q: q["obs"][:5], r"shape \(5, 10, 4\) must be \[S=6"),
    ("action", lambda q: q["action"][:, :9], "must start with"),
    ("reward", lambda q: q["reward"][..., None], r"must be \[S, L\]"),
    ("pairs", lambda q: np.array([[0, 6]], np.int32), r"row 0 \[0, 6\] is out of range for 6 segments"),
    ("pairs", lambda q: np.array([[2, 2]], np.int32), "pairs segment 2 with itself"),
    ("pairs", lambda q: np.zeros((3,), np.int32), r"integer \[P, 2\]"),
    ("segment_ids", lambda q: np.array(["a", "b", "a", "c", "d", "e"]), "duplicate id 'a'"),
    ("segment_ids", lambda q: np.arange(6), "1-d str array"),
    ("env", lambda q: np.array(["CartPole-v1"]), "0-d str array"),
    ("absorbing", lambda q: q["absorbing"][:, :9], r"must be \[S, L\]=\[6, 10\]"),
    ("absorbing", lambda q: q["absorbing"] + 0.5, "only 0 and 1"),
])
def test_each_bad_field_is_named_with_the_file(cartpole, tmp_path, field, make_value, message):
    path = tmp_path / "bad.npz"
    save_queries_unchecked(path, broken(cartpole, field, make_value(cartpole)))
    with pytest.raises(QueryFileError, match=f"bad.npz: {field}: .*{message}"):
        load_queries(path)


def save_queries_unchecked(path, queries):
    np.savez(path, **queries)


def test_unreadable_files_are_named(tmp_path):
    (tmp_path / "queries.npz").write_text("not an archive")
    with pytest.raises(QueryFileError, match="queries.npz: not a readable queries file"):
        load_queries(tmp_path / "queries.npz")
    with pytest.raises(QueryFileError, match="missing.npz: not a readable"):
        load_queries(tmp_path / "missing.npz")
