"""Market-making environments, their data, and their closed-form baselines.

Model-based (``market_quoting``):

- ``quoting``: the quoting problem of Avellaneda and Stoikov and of Cartea and Jaimungal: a mid
  price (Brownian, Ornstein-Uhlenbeck or with jumps), market orders arriving as a Poisson or Hawkes
  process, our quotes filled with probability ``exp(-k * depth)`` per arrival.
- ``baselines``: fixed spread, Avellaneda-Stoikov, the Cartea-Jaimungal finite-inventory optimum
  (matrix exponential) and the Gueant-Lehalle-Fernandez-Tapia asymptotic quotes, plus ``simulate``
  to run any of them (or a learned policy) over many paths in one jitted program.
- ``quoting_study``: the ``mm_quoting`` table (PPO against the optimum).

On order-book days (``market_book``):

- ``data``: the in-memory day, its ``.npz`` file format, and loaders for LOBSTER, Tardis and a
  generic L2 snapshot CSV; ``synthetic``: a seeded order-flow-driven book with regimes.
- ``features``: decision steps (time- or event-based), trades per step, market features.
- ``rewards``: the seven reward functions; ``book``: the 17-action environment with queue positions.
- ``event_study``: the ``mm_event_vs_time`` table.
"""
