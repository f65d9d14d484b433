#!/usr/bin/env bash
# Set up (first run only) and start the Caliber dashboard on the bundled demo data.
source "$(dirname "$0")/_setup_env.sh" requirements.txt
# Bound to 127.0.0.1 (this machine only) unless an address is given, e.g. --server.address=0.0.0.0.
exec .venv/bin/python -m streamlit run app.py --server.address=127.0.0.1 --browser.gatherUsageStats=false "$@"
