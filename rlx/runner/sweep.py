"""Hyper-parameter grids trained inside one compiled program.

``sweep.algo.lr=[1e-4,3e-4] sweep.algo.ent_coef=[0,0.01]`` crosses into a
grid of four points. Every point is a full, validated agent ``Config``; their
numeric leaves are stacked along a leading grid axis that the runner vmaps
together with the seeds, so one compilation trains every combination. Fields
that change the program's shapes (static fields) cannot be stacked: those are
swept across programs with Hydra multirun instead.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

import numpy as np

from rlx.errors import ConfigError

SWEEPABLE_SECTIONS = ("algo",)


@dataclasses.dataclass(frozen=True)
class Grid:
    """The crossed points of a sweep; an empty sweep is a single point and ``swept`` is False."""

    fields: tuple[str, ...]  # dotted names, e.g. "algo.lr"
    points: tuple[dict[str, Any], ...]  # one {dotted name: value} per grid point
    configs: tuple[Any, ...]  # the agent Config of each point

    @property
    def swept(self) -> bool:
        return bool(self.fields)

    @property
    def size(self) -> int:
        return len(self.points)

    def stacked_config(self):
        """One Config whose numeric leaves carry a leading grid axis (the single Config if not swept)."""
        if not self.swept:
            return self.configs[0]
        import jax

        return jax.tree.map(lambda *leaves: np.stack([np.asarray(v, np.float32) for v in leaves]), *self.configs)

    def label(self, index: int) -> str:
        """'lr=0.0003, ent_coef=0.01' for plots and tables ('' if not swept)."""
        return ", ".join(f"{name.split('.', 1)[1]}={value:g}" for name, value in self.points[index].items())


def build_grid(sweep: dict | None, algo_values: dict, agent_module, build_config: Callable) -> Grid:
    """Check the ``sweep:`` section and build one validated Config per grid point.

    ``build_config(agent_module, values)`` turns an ``algo:`` dict into a Config
    (raising ConfigError on bad values), so each point is checked like a plain run.
    """
    axes = _sweep_axes(sweep or {}, agent_module)
    if not axes:
        return Grid((), ({},), (build_config(agent_module, algo_values),))
    fields = tuple(axes)
    points, configs = [], []
    for combination in itertools.product(*axes.values()):
        point = dict(zip(fields, combination))
        overrides = {name.split(".", 1)[1]: value for name, value in point.items()}
        try:
            configs.append(build_config(agent_module, {**algo_values, **overrides}))
        except ConfigError as error:
            raise ConfigError(f"sweep point {_describe(point)}: {error}") from None
        points.append(point)
    return Grid(fields, tuple(points), tuple(configs))


def _sweep_axes(sweep: dict, agent_module) -> dict[str, list]:
    """{'algo.lr': [values...]} in a stable order, after checking names, kinds and values."""
    traced, static = _field_kinds(agent_module.Config)
    axes = {}
    for section, fields in sweep.items():
        if section not in SWEEPABLE_SECTIONS:
            raise ConfigError(f"sweep.{section}: only {', '.join(f'sweep.{s}.*' for s in SWEEPABLE_SECTIONS)} can be swept "
                              "inside one program; sweep anything else with Hydra multirun (-m)")
        if not isinstance(fields, dict):
            raise ConfigError(f"sweep.{section}={fields!r}: must map field names to lists of values")
        for name, values in fields.items():
            dotted = f"{section}.{name}"
            if name in static:
                raise ConfigError(f"sweep.{dotted}: changes the program's shapes and cannot share one compilation; "
                                  f"sweep it with Hydra multirun instead: python -m rlx.train -m ... {dotted}=A,B")
            if name not in traced:
                raise ConfigError(f"sweep.{dotted}: unknown field; sweepable: {', '.join(sorted(traced))}")
            if not isinstance(values, (list, tuple)):
                values = [values]
            if not values:
                raise ConfigError(f"sweep.{dotted}=[]: the list of values is empty")
            for value in values:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(f"sweep.{dotted}: value {value!r} is not a number")
            axes[dotted] = [float(v) for v in values]
    return axes


def _field_kinds(config_class) -> tuple[set[str], set[str]]:
    """(traced numeric field names, static field names) of an agent Config."""
    traced, static = set(), set()
    for field in dataclasses.fields(config_class):
        (traced if field.metadata.get("pytree_node", True) else static).add(field.name)
    return traced, static


def _describe(point: dict) -> str:
    return ", ".join(f"{name}={value:g}" for name, value in point.items())
