"""Host-side tools for preference-based RL: the human label file (``labels``); the agents are in ``rlx/agents``."""
