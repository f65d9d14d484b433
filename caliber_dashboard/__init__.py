"""The Caliber dashboard: a Streamlit app, its pages, and the helpers each page uses.

Entry: :mod:`.app` (``streamlit run``) and :mod:`.navigation` (the page list);
:mod:`.warmup` pays the heavy imports once per server. The pages are the files
of ``pages/``; each page's own helpers sit in a package named after it:

* :mod:`.calibrate`  the Calibrate page: plots, the fresh-noise verification, the thief's readout
* :mod:`.data`       the Data page: uploads and top-k logprob logs
* :mod:`.export`     the Export page: the config, its inputs, the review of a saved config
* :mod:`.extraction` the Extraction page (also read by Export and Policy): runs, their codec,
  the seeding comparison, the page's pieces
* :mod:`.fleet`      the Fleet page: pooling and σ from S alone
* :mod:`.policy`     the Policy page: the level table and the simulation

What several pages share is in :mod:`.common` (session state, caches, figures,
tables, readouts, target entry, widgets); the visitor's persistent store is
:mod:`.workspace`. The Attack cost page needs only :mod:`.common`.
"""
