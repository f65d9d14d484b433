"""Caliber dashboard: choose the logit-noise sigma for a suspected extraction account.

Run with ``python -m streamlit run app.py`` (or ``scripts/dashboard.sh``). Every
page reads widgets, calls ``caliber_core`` and draws; the helpers live in
``caliber_dashboard`` (pages and entry point: ``caliber_dashboard.navigation``).

This file plays two parts. Each session runs it as the page script
(``__name__ == "__main__"``). ``streamlit run app.py`` also imports it once
to find ``app``, a ``st.App`` serving this same script, whose lifespan starts
the warm-up (heavy imports, demo caches) as the server starts, before the
first visitor: Streamlit runs no other code of ours at start-up.
"""

import contextlib

import streamlit as st

if __name__ == "__main__":
    from caliber_dashboard.navigation import run_app

    run_app()
else:

    @contextlib.asynccontextmanager
    async def _warm_up_at_start(_app):
        from caliber_dashboard import warmup

        warmup.start(server=True)
        yield

    app = st.App("app.py", lifespan=_warm_up_at_start)
