#!/usr/bin/env bash
# Set up (first run only) and start the Caliber dashboard on the bundled demo data.
source "$(dirname "$0")/_setup_env.sh" requirements.txt
exec .venv/bin/python -m streamlit run app.py --browser.gatherUsageStats=false "$@"
