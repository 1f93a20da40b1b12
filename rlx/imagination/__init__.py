"""Host-side studies of imagination-based RL (world models, dream augmentations); the agents are in ``rlx/agents``."""
