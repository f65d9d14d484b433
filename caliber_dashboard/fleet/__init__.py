"""The Fleet page's helpers (:mod:`.view`): which models to pool, when to warn, σ from S alone."""
