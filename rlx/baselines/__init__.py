"""Reference policies (random, scripted, closed-form) that trained agents are measured against."""
