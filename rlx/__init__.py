"""rlx: pure-functional, end-to-end jitted reinforcement learning in JAX."""

__version__ = "0.1.0"
