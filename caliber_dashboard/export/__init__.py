"""The Export page's helpers: the config and its command (:mod:`.config`), where the inputs start
(:mod:`.inputs`) and a saved config reviewed against a model (:mod:`.review`)."""
