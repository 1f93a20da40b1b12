"""Algorithm names -> agent modules in ``rlx/agents/``.

The registry lives outside ``rlx/agents/`` because agent files (and their
package) must import nothing from rlx: each is meant to be copied alone.
"""

from __future__ import annotations

import importlib

from rlx.errors import UnknownNameError

AGENTS = {
    "a2c": "rlx.agents.a2c",
    "map_policy": "rlx.agents.map_policy",
    "mappo": "rlx.agents.mappo",
    "ppo": "rlx.agents.ppo",
    "ppo_rnn": "rlx.agents.ppo_rnn",
    "pref_ppo": "rlx.agents.pref_ppo",
}


def load(name: str):
    """The agent module registered under ``name``."""
    if name not in AGENTS:
        raise UnknownNameError("algo", name, sorted(AGENTS))
    return importlib.import_module(AGENTS[name])
