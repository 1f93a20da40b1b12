"""Spreading the seeds (or sweep points) of a run over every local device.

With more than one device, each program runs under ``jax.shard_map`` on a 1-D
``Mesh``: every device gets an equal slice of the seed axis (or, when the
seeds do not divide evenly but the grid points do, of the grid axis) and runs
the same per-seed computation as a single device would. When neither divides,
the seed axis is padded to a multiple of the device count with copies of the
first seeds (same keys, so the same computation), whose results are dropped:
5 seeds on 2 devices run as 3 + 3. Seeds never interact, so the results equal
the single-device run's. Multi-host clusters call
``jax.distributed.initialize()`` first; the mesh then spans every process's
devices (see the README).
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "batch"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which axis of the run's arrays is split over devices; ``None`` when running on one device."""

    mesh: Mesh | None
    split_grid: bool  # True: the grid axis is split; False: the seed axis
    swept: bool
    run_seeds: int | None = None  # seeds the programs compute, padded up to a multiple of the devices; None: no padding

    @property
    def active(self) -> bool:
        return self.mesh is not None

    def spec(self, seed_axis: int, grid_axis: int = 0) -> PartitionSpec:
        """Spec of an array with its seed axis at ``seed_axis`` (and, if swept, its grid axis at ``grid_axis``)."""
        split_axis = grid_axis if self.split_grid else seed_axis
        return PartitionSpec(*([None] * split_axis), AXIS)

    def replicated(self) -> PartitionSpec:
        return PartitionSpec()

    def sharding(self, spec: PartitionSpec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)


def plan(num_seeds: int, grid_size: int, swept: bool, devices=None) -> Layout:
    """Split seeds if they divide evenly over the devices, else grid points, else seeds padded with
    copies up to a multiple of the device count; a single seed (nothing to gain) stays on one device."""
    devices = list(devices if devices is not None else jax.devices())
    count = len(devices)
    if count == 1:
        return Layout(None, False, swept)
    if num_seeds % count == 0:
        return Layout(Mesh(devices, (AXIS,)), False, swept)
    if swept and grid_size % count == 0:
        return Layout(Mesh(devices, (AXIS,)), True, swept)
    if num_seeds > 1:
        return Layout(Mesh(devices, (AXIS,)), False, swept, run_seeds=-(-num_seeds // count) * count)
    return Layout(None, False, swept)


def explain(layout: Layout, num_seeds: int, grid_size: int) -> str:
    """One line for the console about where the run executes."""
    count = jax.device_count()
    if layout.run_seeds:
        return (f"{count} devices: {num_seeds} seeds padded to {layout.run_seeds} with copies of the first "
                f"{layout.run_seeds - num_seeds} (their results are dropped), {layout.run_seeds // count} on each")
    if layout.active:
        what, total = ("sweep points", grid_size) if layout.split_grid else ("seeds", num_seeds)
        return f"{count} devices: {total} {what}, {total // count} on each"
    if count > 1 and num_seeds == grid_size == 1:
        return f"{count} devices, one seed and no sweep: running on one device"
    if count > 1:
        return (f"{count} devices, but num_seeds={num_seeds} and the {grid_size} sweep point(s) do not split evenly: "
                f"running on one device")
    return f"1 device ({jax.devices()[0].platform})"
