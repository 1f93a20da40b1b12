"""The preference label file: one JSON object per line, appended as answers arrive.

Format (JSONL, UTF-8), one line per answered query::

    {"query": 17, "left": "u3-e2-s4", "right": "u5-e0-s1", "answer": "right", "env": "CartPole-v1"}

- ``query``: an integer, unique in the file (a later line with the same query is an error);
- ``left`` / ``right``: the ids of the two segments shown (strings);
- ``answer``: ``left`` (the left segment is better), ``right``, ``equal`` (a tie) or ``skip``
  (cannot tell: kept, but masked out of the reward-model loss);
- ``env`` (optional; ``rlx.label`` writes it): the environment of the queries answered. Queries
  remade with the same seed and shape for another environment have the same segment ids and pairs,
  so without it their answers would pass for the new ones'.

``read_labels`` turns a file into arrays in the convention of ``rlx/agents/pref_ppo.py``: the
label is the probability that the *second* (right) segment is preferred (left 0, right 1, equal
0.5) and a mask is 0 for skipped queries. ``append_label`` writes one answer and flushes it to
disk at once, so nothing answered is lost if the labelling page or server is closed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from rlx.errors import InputError

ANSWERS = {"left": 0.0, "right": 1.0, "equal": 0.5, "skip": 0.5}
FIELDS = ("query", "left", "right", "answer")


class LabelError(InputError):
    """A malformed label file: the message names the file and the line."""


def append_label(path, query: int, left: str, right: str, answer: str, env: str | None = None) -> None:
    """Append one answer and make it durable (flush and fsync) before returning."""
    if answer not in ANSWERS:
        raise LabelError(f"answer {answer!r}: valid answers are {', '.join(ANSWERS)}")
    fields = {"query": int(query), "left": str(left), "right": str(right), "answer": answer}
    record = json.dumps({**fields, "env": str(env)} if env is not None else fields)
    with open(path, "a+b") as handle:
        if handle.tell() > 0:  # a last line without its newline (an edit by hand) must not swallow this one
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                record = "\n" + record
        handle.write((record + "\n").encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


def read_labels(path, known_segments=None, env: str | None = None) -> dict[str, np.ndarray]:
    """``{"query", "left", "right", "label", "mask", "line"}`` arrays from a label file (``line``: each answer's line
    in the file); ``LabelError`` at the first bad line.

    ``known_segments`` (a set of ids), when given, rejects answers about segments that do not exist; ``env``
    rejects answers whose line names another environment.
    """
    path = Path(path)
    if not path.is_file():
        raise LabelError(f"{path}: no such label file")
    queries, lefts, rights, labels, masks, lines, seen = [], [], [], [], [], [], {}
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{path}, line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise LabelError(f"{where}: not UTF-8 text ({error.reason} at byte {error.start})") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                torn = "" if raw.endswith(b"\n") else (
                    "; the last line, without its newline: an answer cut short by a crash? The lines before it are "
                    "whole: move this one out of the file and answer that query again")
                raise LabelError(f"{where}: not a JSON object ({error.msg}){torn}") from None
            if not isinstance(record, dict):
                raise LabelError(f"{where}: not a JSON object")
            missing = [field for field in FIELDS if field not in record]
            if missing:
                raise LabelError(f"{where}: missing {', '.join(missing)} (a line needs {', '.join(FIELDS)})")
            query, answer = record["query"], record["answer"]
            if not isinstance(query, int) or isinstance(query, bool):
                raise LabelError(f"{where}: query {query!r} is not an integer")
            if query in seen:
                raise LabelError(f"{where}: query {query} was already answered on line {seen[query]}")
            if not isinstance(answer, str) or answer not in ANSWERS:
                raise LabelError(f"{where}: unknown answer {answer!r}; valid: {', '.join(ANSWERS)}")
            for side in ("left", "right"):
                if not isinstance(record[side], (str, int)) or isinstance(record[side], bool):
                    raise LabelError(f"{where}: {side} segment id {record[side]!r} is not a string or integer")
                if known_segments is not None and record[side] not in known_segments:
                    raise LabelError(f"{where}: unknown {side} segment id {record[side]!r}")
            if env is not None and "env" in record and record["env"] != env:
                raise LabelError(f"{where}: answers queries of {record['env']!r}, but these queries are of {env!r}; "
                                 "were the queries remade after labelling?")
            seen[query] = number
            queries.append(query)
            lefts.append(str(record["left"]))
            rights.append(str(record["right"]))
            labels.append(ANSWERS[answer])
            masks.append(0.0 if answer == "skip" else 1.0)
            lines.append(number)
    return {"query": np.asarray(queries, np.int64), "left": np.asarray(lefts), "right": np.asarray(rights),
            "label": np.asarray(labels, np.float32), "mask": np.asarray(masks, np.float32),
            "line": np.asarray(lines, np.int64)}
