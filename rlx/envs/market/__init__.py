"""Market-making environments and their closed-form baselines.

- ``quoting``: the model-based quoting problem of Avellaneda and Stoikov and of
  Cartea and Jaimungal: a mid price (Brownian, Ornstein-Uhlenbeck or with
  jumps), market orders arriving as a Poisson or Hawkes process, our quotes
  filled with probability ``exp(-k * depth)`` per arrival.
- ``baselines``: fixed spread, Avellaneda-Stoikov, the Cartea-Jaimungal
  finite-inventory optimum (matrix exponential) and the Gueant-Lehalle-
  Fernandez-Tapia asymptotic quotes, plus ``simulate`` to run any of them (or a
  learned policy) over many paths in one jitted program.
"""
