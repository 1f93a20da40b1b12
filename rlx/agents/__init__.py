"""Agent registry. Each agent is one self-contained module in this folder.

Agent modules never import from rlx (they are meant to be copied alone), so
this registry is the only place that knows their names.
"""

from __future__ import annotations

import importlib

from rlx.errors import UnknownNameError

AGENTS = {"ppo": "rlx.agents.ppo"}


def load(name: str):
    """The agent module registered under ``name``."""
    if name not in AGENTS:
        raise UnknownNameError("algo", name, sorted(AGENTS))
    return importlib.import_module(AGENTS[name])
