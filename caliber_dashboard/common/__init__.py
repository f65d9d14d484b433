"""What several pages share (no page's own logic).

* :mod:`.state`    the session's models and choices, backed by its workspace
* :mod:`.cache`    results cached by content digest, with progress on a miss
* :mod:`.calibration_store` finished calibrations kept in the workspace
* :mod:`.background` session work run after the page is drawn
* :mod:`.ui`       widgets shared by several pages (model picker, target control)
* :mod:`.figures`  plain plotly figure builders (no Streamlit)
* :mod:`.curves`   plot-ready curves of a calibration on the normalized axes (no Streamlit)
* :mod:`.tables`   the sweep, model and fleet tables (no Streamlit)
* :mod:`.readouts` readout text for a served target, with its interval (no Streamlit)
* :mod:`.rounding` numbers rounded to the digits their interval supports (no Streamlit)
* :mod:`.targets`  target kinds, percent fields and slider ranges (no Streamlit)
* :mod:`.names`    visitors' names as plain text in Markdown, Plotly, CSV and file names (no Streamlit)
* :mod:`.commands` shown command lines, every word shell-quoted by one function (no Streamlit)
* :mod:`.upload_boundary` the element limit of an upload and one line for any refusal (no Streamlit)
"""
