"""Runtime: executors of lowered plans (generic loop-tree interpreter)."""
