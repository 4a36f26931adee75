"""The pure core: a run's working state, one reducer per event type, the decision on one
patch, the driver that folds log records through them, and their outcomes. No I/O."""
