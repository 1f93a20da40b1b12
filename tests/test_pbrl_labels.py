"""The preference label file: round trip, the pref_ppo label convention, and one clear error per bad line."""

import numpy as np
import pytest

from rlx.pbrl.labels import LabelError, append_label, read_labels


def test_appended_answers_read_back_in_the_agent_convention(tmp_path):
    path = tmp_path / "labels.jsonl"
    for query, answer in enumerate(["left", "right", "equal", "skip"]):
        append_label(path, query, f"a{query}", f"b{query}", answer)
    labels = read_labels(path, known_segments={f"{s}{i}" for s in "ab" for i in range(4)})
    np.testing.assert_array_equal(labels["query"], [0, 1, 2, 3])
    np.testing.assert_allclose(labels["label"], [0.0, 1.0, 0.5, 0.5])  # P(right preferred)
    np.testing.assert_allclose(labels["mask"], [1, 1, 1, 0])  # skipped: kept, masked
    assert list(labels["right"]) == ["b0", "b1", "b2", "b3"]


@pytest.mark.parametrize("line, message", [
    ('{"query": 1, "left": "a", "right": "b", "answer": "maybe"}', "line 2: unknown answer 'maybe'; valid: left, right"),
    ('{"query": 1, "left": "a", "right": "zz", "answer": "left"}', "line 2: unknown right segment id 'zz'"),
    ('{"query": 0, "left": "a", "right": "b", "answer": "left"}', "line 2: query 0 was already answered on line 1"),
    ('{"query": 1, "left": "a", "answer": "left"}', "line 2: missing right"),
    ('{"query": "one", "left": "a", "right": "b", "answer": "left"}', "line 2: query 'one' is not an integer"),
    ('{"query": 1, "left": "a", ', "line 2: not a JSON object"),
    ('{"query": 1, "left": "a", "right": "b", "answer": ["left"]}', "line 2: unknown answer \\['left'\\]"),
    ('{"query": 1, "left": ["a"], "right": "b", "answer": "left"}', "line 2: left segment id \\['a'\\] is not a"),
    ('{"query": 1, "left": "a", "right": "b", "answer": "\xff"}', "line 2: unknown answer"),
])
def test_bad_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "labels.jsonl"
    path.write_text('{"query": 0, "left": "a", "right": "b", "answer": "right"}\n' + line + "\n")
    with pytest.raises(LabelError, match=f"labels.jsonl, {message}"):
        read_labels(path, known_segments={"a", "b"})


def test_undecodable_bytes_name_their_line(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_bytes(b'{"query": 0, "left": "a", "right": "b", "answer": "right"}\n\xff\xfe{"query": 1}\n')
    with pytest.raises(LabelError, match="labels.jsonl, line 2: not UTF-8 text"):
        read_labels(path)
    # Also inside a string, where replacing the bytes would have read as a valid (wrong) segment id.
    path.write_bytes(b'\n{"query": 0, "left": "a\xe0", "right": "b", "answer": "right"}\n')
    with pytest.raises(LabelError, match="labels.jsonl, line 2: not UTF-8 text"):
        read_labels(path)


def test_an_answer_cut_short_by_a_crash_says_how_to_recover(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_bytes(b'{"query": 0, "left": "a", "right": "b", "answer": "right"}\n{"query": 1, "le')
    with pytest.raises(LabelError, match=r"line 2: not a JSON object .*cut short by a crash\? The lines before it"):
        read_labels(path)
    path.write_bytes(b'{"query": 0, "left": "a", "right": "b", "answer": "right"}\n{oops\n')  # a whole bad line
    with pytest.raises(LabelError, match=r"line 2: not a JSON object \([^)]*\)$"):
        read_labels(path)


def test_answers_keep_their_file_lines(tmp_path):
    path = tmp_path / "labels.jsonl"
    path.write_text('\n{"query": 0, "left": "a", "right": "b", "answer": "right"}\n\n\n'
                    '{"query": 1, "left": "b", "right": "a", "answer": "skip"}\n')
    np.testing.assert_array_equal(read_labels(path)["line"], [2, 5])


def test_append_rejects_an_unknown_answer_and_missing_files_are_named(tmp_path):
    with pytest.raises(LabelError, match="valid answers are left, right, equal, skip"):
        append_label(tmp_path / "l.jsonl", 0, "a", "b", "both")
    assert not (tmp_path / "l.jsonl").exists()
    with pytest.raises(LabelError, match="no such label file"):
        read_labels(tmp_path / "missing.jsonl")
