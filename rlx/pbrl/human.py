"""Training on a human's labels: ``algo.teacher=file algo.label_dir=DIR``.

``DIR`` is a labelling directory of ``python -m rlx.label``: ``queries.npz`` (the segments and the
pairs shown, ``rlx/pbrl/queries.py``) and ``labels.jsonl`` (the answers, ``rlx/pbrl/labels.py``).
The answered pairs become ``pref_ppo.GivenLabels``; the run's ``budget`` is set to their number and
its feedback rounds retrain the reward model on them instead of asking a scripted teacher.
"""

from __future__ import annotations

import functools
import types
from pathlib import Path

import numpy as np

from rlx.errors import ConfigError
from rlx.pbrl.labels import LabelError, read_labels
from rlx.pbrl.queries import QueryFileError, known_segment_ids, load_queries


def given_labels(label_dir, env_name: str | None = None) -> dict:
    """The answered pairs of ``label_dir`` as arrays ``obs0, action0, obs1, action1, label, mask,
    absorbing0, absorbing1``.

    Raises ``ConfigError`` naming the file (and line) for a missing or malformed file, labels
    about unknown segments, an environment other than ``env_name``, or no answers at all.
    """
    label_dir = Path(label_dir)
    queries_path, labels_path = label_dir / "queries.npz", label_dir / "labels.jsonl"
    try:
        queries = load_queries(queries_path)
        answers = read_labels(labels_path, known_segment_ids(queries), env=str(queries["env"]))
    except (QueryFileError, LabelError) as error:
        raise ConfigError(f"algo.label_dir={label_dir}: {error}") from None
    if env_name is not None and str(queries["env"]) != env_name:
        raise ConfigError(f"algo.label_dir={label_dir}: {queries_path} holds {queries['env']} segments, "
                          f"but this run trains on {env_name}")
    if len(answers["query"]) == 0:
        raise ConfigError(f"algo.label_dir={label_dir}: {labels_path} has no answers yet")
    index = {segment: i for i, segment in enumerate(queries["segment_ids"].tolist())}
    pairs = queries["pairs"]
    for line, query, left, right in zip(answers["line"], answers["query"], answers["left"], answers["right"]):
        if not 0 <= query < len(pairs) or tuple(pairs[query]) != (index[left], index[right]):
            raise ConfigError(f"algo.label_dir={label_dir}: {labels_path}, line {line}: query {query} is not "
                              f"the pair ({left}, {right}) of {queries_path}")
    left = np.asarray([index[s] for s in answers["left"]])
    right = np.asarray([index[s] for s in answers["right"]])
    return {"obs0": queries["obs"][left], "action0": queries["action"][left],
            "obs1": queries["obs"][right], "action1": queries["action"][right],
            "label": answers["label"], "mask": answers["mask"],
            "absorbing0": queries["absorbing"][left], "absorbing1": queries["absorbing"][right]}


def bind(agent_module, algo_values: dict, env_name: str):
    """``agent_module`` as is, or (``teacher=file``) a view of it whose ``make`` carries the labels.

    Pops ``label_dir`` from ``algo_values`` (it is no ``Config`` field) and sets ``budget``.
    """
    label_dir = algo_values.pop("label_dir", None)
    if algo_values.get("teacher") != "file":
        if label_dir:
            raise ConfigError(f"algo.label_dir={label_dir}: only read with algo.teacher=file "
                              f"(teacher is {algo_values.get('teacher')!r})")
        return agent_module
    if not label_dir:
        raise ConfigError("algo.label_dir: required with algo.teacher=file (a directory of `python -m rlx.label`)")
    arrays = given_labels(label_dir, env_name)
    algo_values["budget"] = len(arrays["label"])
    algo_values["queries_per_feedback"] = min(int(algo_values.get("queries_per_feedback", 1)), algo_values["budget"])
    view = types.SimpleNamespace(**{name: getattr(agent_module, name) for name in dir(agent_module)
                                    if not name.startswith("__")})
    view.make = functools.partial(agent_module.make, given_labels=agent_module.GivenLabels(**arrays))
    return view
