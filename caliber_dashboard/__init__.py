"""The Caliber dashboard's helpers: figure builders, plot series, session state, caches.

* :mod:`series`  plot-ready series computed from a Calibration (no Streamlit)
* :mod:`figures` plain plotly figure builders: data in, figure out (no Streamlit)
* :mod:`state`   the per-session model store in ``st.session_state``
* :mod:`cache`   results cached by content digest, with progress on a miss
* :mod:`ui`      widgets shared by several pages (model picker, target control)
"""
