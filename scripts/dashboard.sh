#!/usr/bin/env bash
# Set up (first run only) and start the Caliber dashboard on the bundled demo data.
# Bound to 127.0.0.1 (this machine only) unless an address is given, e.g. --server.address=0.0.0.0;
# other Streamlit options after `--`.
source "$(dirname "$0")/_setup_env.sh" requirements.txt
exec .venv/bin/python -m caliber_core dashboard "$@"
