"""The Caliber dashboard's helpers: figure builders, plot curves, session state, caches.

* :mod:`curves`  plot-ready curves of a Calibration on the normalized axes (no Streamlit)
* :mod:`targets` target kinds, percent fields and slider ranges (no Streamlit)
* :mod:`tables`  the sweep, model and fleet tables (no Streamlit)
* :mod:`verification` sigma* checked with fresh noise (no Streamlit)
* :mod:`figures` plain plotly figure builders: data in, figure out (no Streamlit)
* :mod:`state`   the per-session model store in ``st.session_state``
* :mod:`cache`   results cached by content digest, with progress on a miss
* :mod:`ui`      widgets shared by several pages (model picker, target control)
"""
