"""Caliber dashboard: choose the logit-noise sigma for a suspected extraction account.

Run with ``python -m streamlit run app.py`` (or ``scripts/dashboard.sh``). Every
page reads widgets, calls ``caliber_core`` and draws; the helpers live in
``caliber_dashboard`` (pages and entry point: ``caliber_dashboard.navigation``).
"""

from caliber_dashboard.navigation import run_app

run_app()
