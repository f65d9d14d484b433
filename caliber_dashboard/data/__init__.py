"""The Data page's helpers: uploads validated and stored (:mod:`.uploads`) and a top-k logprob log
calibrated on agreement alone (:mod:`.logprob_log`)."""
