"""The Extraction page's helpers: finished runs kept in the workspace (:mod:`.runs`), their JSON form
(:mod:`.codec`), the seeding comparison (:mod:`.seedings`) and the page's pieces (:mod:`.view`).

The Export and Policy pages read the runs too: the thief's σ and the attacker's recipes."""
