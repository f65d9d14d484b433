"""The Calibrate page's helpers: its plots (:mod:`.plots`), sigma* verified with fresh noise
(:mod:`.verification`) and the surrogate thief's readout beside the served sigma (:mod:`.thief`)."""
