"""asv suites for spfuse: one module per area, shared helpers in :mod:`.common`."""
