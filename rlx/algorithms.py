"""Algorithm names -> agent modules in ``rlx/agents/``.

The registry lives outside ``rlx/agents/`` because agent files (and their
package) must import nothing from rlx: each is meant to be copied alone.
"""

from __future__ import annotations

import importlib

from rlx.errors import UnknownNameError

AGENTS = {
    "a2c": "rlx.agents.a2c",
    "dreamer": "rlx.agents.dreamer",
    "dyna_ppo": "rlx.agents.dyna_ppo",
    "map_policy": "rlx.agents.map_policy",
    "mappo": "rlx.agents.mappo",
    "ppo": "rlx.agents.ppo",
    "ppo_rnn": "rlx.agents.ppo_rnn",
    "pref_ppo": "rlx.agents.pref_ppo",
}


# Agents that train on multi-agent environments (the array-per-agent contract, ``rlx.envs.multi_agent``);
# the others train on single-agent ones.
MULTI_AGENT = frozenset({"mappo", "map_policy"})


# Inputs an agent takes besides its Config, read on the host from its ``algo:`` section:
# name -> "module:function(agent_module, algo_values, env_name) -> agent_module".
HOST_INPUTS = {
    "pref_ppo": "rlx.pbrl.human:bind",  # a human's label file (teacher=file, label_dir=DIR)
}


def bind_host_inputs(name: str, agent_module, algo_values: dict, env_name: str):
    """``agent_module`` with its host inputs bound (their keys popped from ``algo_values``)."""
    if name not in HOST_INPUTS:
        return agent_module
    module_name, function = HOST_INPUTS[name].split(":")
    return getattr(importlib.import_module(module_name), function)(agent_module, algo_values, env_name)


def load(name: str):
    """The agent module registered under ``name``."""
    if name not in AGENTS:
        raise UnknownNameError("algo", name, sorted(AGENTS))
    return importlib.import_module(AGENTS[name])
