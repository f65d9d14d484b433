"""The Policy page's helpers (:mod:`.view`): the level table, the simulation's trajectories, the saved choices."""
