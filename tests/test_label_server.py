"""The labelling server over HTTP (no browser): one durable line per answer, restarts, refusals, the CLI."""

import json
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlx.label import make_server
from rlx.pbrl.labels import LabelError, read_labels
from rlx.pbrl.queries import make_queries, save_queries

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def queries_file(tmp_path_factory):
    queries = make_queries("CartPole-v1", num_pairs=4, segment_length=10, key_seed=0, num_envs=2, num_steps=20)
    path = tmp_path_factory.mktemp("queries") / "queries.npz"
    save_queries(path, queries)
    return path


@pytest.fixture
def run_dir(queries_file, tmp_path):
    shutil.copy(queries_file, tmp_path / "queries.npz")
    return tmp_path


@contextmanager
def serving(run_dir):
    """A label server on a free port in a background thread, shut down on exit."""
    server = make_server(run_dir, port=0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def call(server, path, body=None, headers=None):
    """``(status, JSON reply)`` of a GET (or a POST when ``body`` is given)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(server.url.rstrip("/") + path, data=data,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def lines(run_dir):
    path = run_dir / "labels.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_binds_localhost_and_serves_the_page(run_dir):
    with serving(run_dir) as server:
        assert server.server_address[0] == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.server_address[1]}/"
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert b"<canvas" in response.read()
        assert call(server, "/nothing")[0] == 404


def test_each_answer_is_one_line_with_the_pairs_ids(run_dir):
    with serving(run_dir) as server:
        status, first = call(server, "/api/next")
        assert status == 200 and first["query"] == 0 and first["answered"] == 0 and first["total"] == 4
        assert first["env"] == "CartPole-v1" and len(first["left"]["obs"]) == 10 and len(first["left"]["obs"][0]) == 4
        left_index = server.queries["pairs"][0, 0]
        assert first["left"]["absorbing"] == server.queries["absorbing"][left_index].astype(int).tolist()
        for query, answer in enumerate(["left", "right", "equal", "skip"]):
            status, reply = call(server, "/api/answer", {"query": query, "answer": answer})
            assert status == 200 and reply["answered"] == query + 1
            written = lines(run_dir)
            assert len(written) == query + 1  # on disk before the reply
            left, right = server.segment_ids(query)
            assert written[-1] == {"query": query, "left": left, "right": right, "answer": answer, "env": "CartPole-v1"}
        assert reply["done"] is True and "query" not in reply
    assert read_labels(run_dir / "labels.jsonl")["mask"].tolist() == [1, 1, 1, 0]


def test_a_restarted_server_continues_with_the_first_unanswered_query(run_dir):
    with serving(run_dir) as server:
        assert call(server, "/api/answer", {"query": 0, "answer": "left"})[0] == 200
        assert call(server, "/api/answer", {"query": 2, "answer": "right"})[0] == 200
    with serving(run_dir) as server:
        status, reply = call(server, "/api/next")
        assert (reply["query"], reply["answered"]) == (1, 2)
        assert call(server, "/api/answer", {"query": 1, "answer": "equal"})[1]["query"] == 3
    assert [line["query"] for line in lines(run_dir)] == [0, 2, 1]


@pytest.mark.parametrize("body, status, message", [
    ({"query": 0, "answer": "both"}, 400, "unknown answer 'both'; valid: left, right, equal, skip"),
    ({"query": 0, "answer": ["left"]}, 400, "unknown answer ['left']"),
    ({"query": 4, "answer": "left"}, 400, "unknown query 4: query ids are 0..3"),
    ({"query": "0", "answer": "left"}, 400, "unknown query '0'"),
    ({"answer": "left"}, 400, "unknown query None"),
    (b"{not json", 400, "not valid JSON"),
    ([0, "left"], 400, "must be a JSON object"),
])
def test_bad_answers_are_refused_and_nothing_is_written(run_dir, body, status, message):
    with serving(run_dir) as server:
        code, reply = call(server, "/api/answer", body)
        assert code == status and message in reply["error"]
    assert lines(run_dir) == []


def test_a_second_answer_to_a_query_conflicts(run_dir):
    with serving(run_dir) as server:
        call(server, "/api/answer", {"query": 0, "answer": "left"})
        code, reply = call(server, "/api/answer", {"query": 0, "answer": "right"})
        assert code == 409 and "already answered" in reply["error"]
    assert len(lines(run_dir)) == 1


def test_other_hosts_and_form_posts_are_refused(run_dir):
    with serving(run_dir) as server:
        assert call(server, "/api/next", headers={"Host": "evil.example:80"})[0] == 403
        code, reply = call(server, "/api/answer", b"query=0&answer=left",
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert code == 400 and "Content-Type: application/json" in reply["error"]
    assert lines(run_dir) == []


def test_labels_from_other_queries_are_refused_at_start(run_dir):
    (run_dir / "labels.jsonl").write_text('{"query": 0, "left": "e1-t0", "right": "e1-t0", "answer": "left"}\n')
    with pytest.raises(LabelError, match="labels.jsonl, line 1: query 0 answers segments"):
        make_server(run_dir)


def test_the_command_line_serves_and_reports_bad_keys(run_dir):
    done = subprocess.run([sys.executable, "-m", "rlx.label", f"run_dir={run_dir}", "colour=red"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "key one of run_dir, env, pairs, segment_length, seed, port, open" in done.stderr
    process = subprocess.Popen([sys.executable, "-m", "rlx.label", f"run_dir={run_dir}", "pairs=9"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    watchdog = threading.Timer(60, process.kill)  # a hung start fails the test instead of blocking readline
    watchdog.start()
    try:
        output = [process.stdout.readline() for _ in range(3)]
        assert "note: pairs ignored" in output[1]
        assert output[2].startswith("serving http://127.0.0.1:")
        with urllib.request.urlopen(output[2].split()[1] + "api/next", timeout=10) as response:
            assert json.loads(response.read())["total"] == 4
    finally:
        watchdog.cancel()
        process.terminate()
        process.wait(timeout=10)


def test_an_answer_for_segments_the_page_did_not_show_is_refused_with_the_current_query(run_dir):
    """A page left open while the queries were remade used to store its answer against the new pair."""
    with serving(run_dir) as server:
        _, shown = call(server, "/api/next")
        code, reply = call(server, "/api/answer", {"query": 0, "answer": "left", "left": shown["right"]["id"],
                                                   "right": shown["left"]["id"]})
        assert code == 409 and "not the segments" in reply["error"] and reply["next"]["query"] == 0
        code, reply = call(server, "/api/answer", {"query": 0, "answer": "left", "left": shown["left"]["id"]})
        assert code == 400 and "give both" in reply["error"]
        assert lines(run_dir) == []
        code, reply = call(server, "/api/answer", {"query": 0, "answer": "left", "left": shown["left"]["id"],
                                                   "right": shown["right"]["id"]})
        assert code == 200 and reply["query"] == 1
        code, reply = call(server, "/api/answer", {"query": 0, "answer": "right"})  # a second tab, behind
        assert code == 409 and reply["next"]["query"] == 1  # what that tab shows now
    assert [line["answer"] for line in lines(run_dir)] == ["left"]


def test_one_server_per_run_directory(run_dir):
    """Two servers each accepted an answer to query 0; the label file, holding it twice, no longer loaded."""
    from rlx.errors import ConfigError

    with serving(run_dir):
        with pytest.raises(ConfigError, match="another rlx.label server is labelling it"):
            make_server(run_dir)
    with serving(run_dir):  # released when the first one closed
        pass


def test_malformed_bodies_get_a_clear_refusal(run_dir):
    with serving(run_dir) as server:
        code, reply = call(server, "/api/answer", b"[" * 2000 + b"]" * 2000)  # RecursionError: no reply at all
        assert code == 400 and "not valid JSON" in reply["error"]
        code, reply = call(server, "/api/answer", b"{}", headers={"Content-Length": "abc"})
        assert code == 400 and "Content-Length" in reply["error"]
    assert lines(run_dir) == []


def test_an_answer_after_a_last_line_without_newline_starts_its_own_line(run_dir):
    from rlx.pbrl.labels import append_label

    path = run_dir / "labels.jsonl"
    path.write_text('{"query": 0, "left": "a", "right": "b", "answer": "left"}')  # edited by hand
    append_label(path, 1, "c", "d", "right")
    assert [line["query"] for line in lines(run_dir)] == [0, 1]


def test_answers_record_their_environment_and_queries_remade_for_another_are_refused(run_dir, tmp_path):
    """Queries remade with the same seed and shape for another environment have the same ids and pairs: the
    CartPole answers used to pass for Acrobot ones, at the server's start and in training."""
    import numpy as np

    from rlx.pbrl.human import given_labels
    from rlx.pbrl.queries import load_queries

    with serving(run_dir) as server:
        call(server, "/api/answer", {"query": 0, "answer": "left"})
    assert lines(run_dir)[0]["env"] == "CartPole-v1"
    remade = dict(load_queries(run_dir / "queries.npz"))
    remade["env"] = np.array("Acrobot-v1")
    save_queries(run_dir / "queries.npz", remade)
    with pytest.raises(LabelError, match="line 1: answers queries of 'CartPole-v1', but these queries are of 'Acrobot-v1'"):
        make_server(run_dir)
    from rlx.errors import ConfigError

    with pytest.raises(ConfigError, match="answers queries of 'CartPole-v1'"):
        given_labels(run_dir)


def test_a_server_that_fails_to_start_leaves_the_directory_free(run_dir):
    (run_dir / "labels.jsonl").write_text('{"query": 0, "left": "e1-t0", "right": "e1-t0", "answer": "left"}\n')
    with pytest.raises(LabelError) as refused:  # the traceback kept here keeps the failed server alive
        make_server(run_dir)
    (run_dir / "labels.jsonl").unlink()
    with serving(run_dir):
        assert refused.value is not None
