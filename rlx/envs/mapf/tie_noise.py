"""Shared tie-break noise: one uniform number per cell and step that a teacher and a learner both see.

PIBT breaks ties between equally good moves at random, and that randomness is
what keeps it out of livelocks (with fixed tie-breaks our PIBT with swap solves
0.52 / 0.09 of the study's maps at N = 32 / 64 instead of 0.91 / 0.62). A
policy imitating it cannot predict a coin it does not see, so it learns a
spread of moves and each agent samples its own, and the samples collide.

Here the coin is shown: each step, every cell gets a number in [0, 1) hashed
from the instance (its agents' starts) and the time, the teacher
(``experts.pibt(..., move_noise=True)``) prefers, among its equally good moves,
the cell with the larger number, and ``MapfEnv``'s ``map_noise`` observations
carry the same numbers as a plane. The teacher's choices then become a
function of what the policy sees, while staying as random as before.

The hash is written once for NumPy (the solvers, on the host) and JAX (the
environment), ``xp`` being either module; both give bit-identical numbers
(``tests/test_mapf_dagger.py``).
"""

from __future__ import annotations

import numpy as np

CELL_STRIDE = 64  # cell id = row * CELL_STRIDE + column (maps up to 64 cells wide)


def _mix(x, xp):
    """A 32-bit integer finaliser (xorshift-multiply), elementwise on ``uint32`` arrays."""
    x = x ^ (x >> 16)
    x = x * xp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * xp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def instance_seed(starts, present, xp=np):
    """``uint32[1]``: a seed from the agents' start cells (``starts [n, 2]``; slots with ``present`` False
    count for nothing), so copies of an instance in any pool share it."""
    cells = (starts[:, 0] * CELL_STRIDE + starts[:, 1] + 1).astype(xp.uint32)
    slots = xp.arange(starts.shape[0], dtype=xp.uint32) * xp.uint32(2) + xp.uint32(1)
    terms = _mix(cells * xp.uint32(0x9E3779B1) + slots * xp.uint32(0x85EBCA77), xp) * present.astype(xp.uint32)
    return xp.sum(terms, dtype=xp.uint32).reshape(1)


def noise_grid(seed, time, height: int, width: int, xp=np):
    """``float32[height, width]`` in [0, 1): the tie-break numbers of step ``time`` of the instance ``seed``."""
    step = _mix(xp.asarray(time, xp.uint32).reshape(1) * xp.uint32(0x27D4EB2F) + xp.uint32(0x165667B1), xp)
    base = _mix(seed ^ step, xp)
    rows = xp.arange(height, dtype=xp.uint32)[:, None] * xp.uint32(CELL_STRIDE)
    cells = rows + xp.arange(width, dtype=xp.uint32)[None, :]
    hashed = _mix(base.reshape(1, 1) ^ (cells * xp.uint32(0x9E3779B1)), xp)
    return (hashed >> 8).astype(xp.float32) / xp.float32(1 << 24)
