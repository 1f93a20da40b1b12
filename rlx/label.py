"""``python -m rlx.label run_dir=DIR [env=CartPole-v1] [pairs=30] [segment_length=50] [seed=0] [port=0] [open=false]``.

A local web page on which a human compares pairs of trajectory segments, for preference-based
RL (``rlx/agents/pref_ppo.py``). The pairs come from ``DIR/queries.npz`` (format in
``rlx/pbrl/queries.py``); when it is missing it is made first, from a rollout of a uniformly
random policy in ``env`` (``env``, ``pairs``, ``segment_length`` and ``seed`` only matter then).
Each answer is appended to ``DIR/labels.jsonl`` (format in ``rlx/pbrl/labels.py``) and on disk
before the page gets its reply, so closing the page or the server loses nothing; a restarted
server continues with the first unanswered query.

The server listens on 127.0.0.1 only (``port=0``: any free port) and prints
``serving http://127.0.0.1:PORT/``; ``open=true`` also opens that address in a browser. Its JSON
API: ``GET /api/next`` (the next unanswered query with both segments' observations and
``absorbing`` flags -- 1 where the episode had ended, drawn as "episode over" -- and the
progress) and ``POST /api/answer`` with ``{"query": id, "answer": "left"|"right"|"equal"|"skip"}``,
plus the ``left`` and ``right`` segment ids the page showed (replies like ``/api/next``; HTTP 400 with
``{"error": message}`` for a bad request; HTTP 409 with ``{"error": message, "next": ...}`` for a query
answered already or ids that are not the query's, as from a page left open while the queries were
remade, and ``next`` is what ``/api/next`` would say). One server per run directory: a second one
is refused at start.
"""

from __future__ import annotations

import fcntl
import json
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path

import numpy as np

from rlx.cli_args import parse_key_values
from rlx.errors import ConfigError, InputError
from rlx.pbrl.labels import ANSWERS, LabelError, append_label, read_labels
from rlx.pbrl.queries import known_segment_ids, load_queries, make_queries, save_queries

OPTIONS = {"run_dir": None, "env": "CartPole-v1", "pairs": "30", "segment_length": "50", "seed": "0", "port": "0",
           "open": "false"}
QUERIES_FILE, LABELS_FILE = "queries.npz", "labels.jsonl"
HOST = "127.0.0.1"
MAX_BODY_BYTES = 4096


def parse(argv: list[str]) -> dict:
    """key=value arguments, checked: unknown keys and bad values name the valid choices."""
    values = parse_key_values(argv, OPTIONS, "python -m rlx.label run_dir=DIR [env=CartPole-v1] [pairs=30]",
                              integers=("pairs", "segment_length", "seed", "port"), booleans=("open",))
    values["given"] = {arg.partition("=")[0] for arg in argv}
    if not 0 <= values["port"] <= 65535:
        raise ConfigError(f"port={values['port']}: must be in [0, 65535] (0: any free port)")
    values["run_dir"] = Path(values["run_dir"])
    return values


def prepare_queries(run_dir: Path, env: str, pairs: int, segment_length: int, seed: int) -> bool:
    """Make and save ``run_dir/queries.npz`` from a random policy unless it exists; True when it was made."""
    path = Path(run_dir) / QUERIES_FILE
    if path.exists():
        return False
    try:
        queries = make_queries(env, pairs, segment_length, seed)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(str(error)) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    save_queries(path, queries)
    return True


def answered_queries(labels_path: Path, queries: dict) -> set[int]:
    """Query ids already answered in the label file, checked against the queries they claim to answer."""
    if not labels_path.exists():
        return set()
    labels = read_labels(labels_path, known_segments=known_segment_ids(queries), env=str(queries["env"]))
    ids, pairs = queries["segment_ids"], queries["pairs"]
    for line, query, left, right in zip(labels["line"].tolist(), labels["query"].tolist(), labels["left"].tolist(),
                                        labels["right"].tolist()):
        if not 0 <= query < len(pairs):
            raise LabelError(f"{labels_path}, line {line}: query {query} is not in {QUERIES_FILE} ({len(pairs)} pairs)")
        expected = (ids[pairs[query, 0]], ids[pairs[query, 1]])
        if (left, right) != expected:
            raise LabelError(f"{labels_path}, line {line}: query {query} answers segments ({left}, {right}) but {QUERIES_FILE} "
                             f"pairs ({expected[0]}, {expected[1]}); were the queries remade after labelling?")
    return set(labels["query"].tolist())


class LabelServer(ThreadingHTTPServer):
    """The labelling server of one run directory: its queries, the answered set and the label file."""

    daemon_threads = True

    def __init__(self, run_dir, port: int = 0):
        self.run_dir = Path(run_dir)
        self.run_lock = hold_run_dir(self.run_dir)  # one server per run directory, before it reads the labels
        try:
            self.queries = load_queries(self.run_dir / QUERIES_FILE)
            self.labels_path = self.run_dir / LABELS_FILE
            self.answered = answered_queries(self.labels_path, self.queries)
            self.lock = threading.Lock()  # one check-and-append at a time: a query is answered once
            self.page = resources.files("rlx.pbrl").joinpath("static/label.html").read_bytes()
            super().__init__((HOST, port), LabelHandler)
        except BaseException:  # a server that fails to start (bad labels, a busy port) leaves the directory free
            self.run_lock.close()
            raise

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/"

    @property
    def num_queries(self) -> int:
        return len(self.queries["pairs"])

    def segment_ids(self, query: int) -> tuple[str, str]:
        left, right = self.queries["pairs"][query]
        return str(self.queries["segment_ids"][left]), str(self.queries["segment_ids"][right])

    def next_query(self) -> dict:
        """The first unanswered query (its two segments' observations, flattened to [L, D]) and the progress."""
        with self.lock:
            answered = len(self.answered)
            pending = next((q for q in range(self.num_queries) if q not in self.answered), None)
        reply = {"env": str(self.queries["env"]), "answered": answered, "total": self.num_queries,
                 "done": pending is None}
        if pending is None:
            return reply
        obs = self.queries["obs"]
        sides = {}
        for side, index, segment_id in zip(("left", "right"), self.queries["pairs"][pending], self.segment_ids(pending)):
            flat = obs[index].reshape(obs.shape[1], -1).astype(np.float64)
            sides[side] = {"id": segment_id, "obs": np.round(flat, 6).tolist(),
                           "absorbing": self.queries["absorbing"][index].astype(int).tolist()}
        return {**reply, "query": pending, "obs_shape": list(obs.shape[2:]), **sides}

    def server_close(self) -> None:
        super().server_close()
        self.run_lock.close()  # releases the run directory

    def record(self, query, answer, shown: tuple | None = None) -> None:
        """Validate one answer and append it to the label file; ``ValueError``, or ``KeyError`` if the query is
        answered already or ``shown`` (the left and right segment ids the page showed) are not its segments."""
        if not isinstance(query, int) or isinstance(query, bool) or not 0 <= query < self.num_queries:
            raise ValueError(f"unknown query {query!r}: query ids are 0..{self.num_queries - 1}")
        if not isinstance(answer, str) or answer not in ANSWERS:
            raise ValueError(f"unknown answer {answer!r}; valid: {', '.join(ANSWERS)}")
        if shown is not None and tuple(shown) != self.segment_ids(query):
            raise KeyError(f"query {query} pairs {self.segment_ids(query)}, not the segments {tuple(shown)} the page "
                           "showed (were the queries remade?); nothing saved")
        with self.lock:
            if query in self.answered:
                raise KeyError(f"query {query} is already answered")
            append_label(self.labels_path, query, *self.segment_ids(query), answer, str(self.queries["env"]))
            self.answered.add(query)


class LabelHandler(BaseHTTPRequestHandler):
    """The page at ``/``, ``GET /api/next`` and ``POST /api/answer``; requests for other hosts are refused."""

    server: LabelServer
    timeout = 10  # seconds: a client that announces more body than it sends does not hold a thread forever

    def do_GET(self) -> None:
        if not self.local_host():
            return
        if self.path in ("/", "/index.html"):
            self.reply(HTTPStatus.OK, self.server.page, "text/html; charset=utf-8")
        elif self.path == "/api/next":
            self.reply_json(HTTPStatus.OK, self.server.next_query())
        else:
            self.reply_json(HTTPStatus.NOT_FOUND, {"error": f"no such page {self.path}"})

    def do_POST(self) -> None:
        if not self.local_host():
            return
        if self.path != "/api/answer":
            self.reply_json(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint {self.path}"})
            return
        try:
            body = self.read_json()
            if ("left" in body) != ("right" in body):
                raise ValueError("give both the left and the right segment id the page showed, or neither")
            shown = (body["left"], body["right"]) if "left" in body else None
            self.server.record(body.get("query"), body.get("answer"), shown)
        except ValueError as error:
            self.reply_json(HTTPStatus.BAD_REQUEST, {"error": str(error)})
        except KeyError as error:  # the page is behind: what it should show now comes with the refusal
            self.reply_json(HTTPStatus.CONFLICT, {"error": error.args[0], "next": self.server.next_query()})
        else:
            self.reply_json(HTTPStatus.OK, self.server.next_query())

    def read_json(self) -> dict:
        """The request's JSON object; ``ValueError`` for anything else (a cross-site form post included)."""
        if self.headers.get_content_type() != "application/json":
            raise ValueError("the body must be JSON (Content-Type: application/json)")
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit() or not 0 < int(length) <= MAX_BODY_BYTES:
            raise ValueError(f"the body must be 1..{MAX_BODY_BYTES} bytes (Content-Length)")
        try:
            body = json.loads(self.rfile.read(int(length)))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting like [[[[...
            raise ValueError("the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ValueError('the body must be a JSON object {"query": id, "answer": ...}')
        return body

    def local_host(self) -> bool:
        """Refuse requests addressed to another host name (DNS rebinding): only 127.0.0.1 and localhost."""
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        if host in (HOST, "localhost"):
            return True
        self.reply_json(HTTPStatus.FORBIDDEN, {"error": f"host {host!r} refused; use {self.server.url}"})
        return False

    def reply_json(self, status: HTTPStatus, payload: dict) -> None:
        self.reply(status, json.dumps(payload).encode(), "application/json")

    def reply(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        """Quiet: one line per request would bury the ``serving`` line."""


def hold_run_dir(run_dir: Path):
    """An exclusive lock on ``run_dir/labels.jsonl.lock`` for as long as the returned file stays open: two
    servers on one directory would each accept an answer to the same query, and the label file, holding it
    twice, would no longer load. ``ConfigError`` if another server holds it."""
    handle = open(Path(run_dir) / f"{LABELS_FILE}.lock", "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(f"run_dir={run_dir}: another rlx.label server is labelling it; stop that one first") from None
    return handle


def make_server(run_dir, port: int = 0) -> LabelServer:
    """A server for ``run_dir`` (which must hold ``queries.npz``), bound to 127.0.0.1; call ``serve_forever``."""
    return LabelServer(run_dir, port)


def main(argv: list[str] | None = None) -> None:
    from rlx.runner import compile_cache

    compile_cache.set_xla_flags()  # before make_queries imports JAX
    try:
        options = parse(sys.argv[1:] if argv is None else argv)
        run_dir = options["run_dir"]
        made = prepare_queries(run_dir, options["env"], options["pairs"], options["segment_length"], options["seed"])
        try:
            server = make_server(run_dir, options["port"])
        except OSError as error:
            raise ConfigError(f"port={options['port']}: cannot listen on {HOST} ({error.strerror})") from None
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    queries = server.queries
    print(f"{'made' if made else 'loaded'} {run_dir / QUERIES_FILE}: {queries['env']}, {server.num_queries} pairs of "
          f"{queries['obs'].shape[1]}-step segments; {len(server.answered)} answered in {server.labels_path}")
    ignored = sorted(options["given"] & {"env", "pairs", "segment_length", "seed"})
    if ignored and not made:
        print(f"note: {', '.join(ignored)} ignored: they apply only when {QUERIES_FILE} is made")
    print(f"serving {server.url}", flush=True)
    if options["open"]:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print(f"stopped: {len(server.answered)} of {server.num_queries} answered in {server.labels_path}")


if __name__ == "__main__":
    main()
