#!/usr/bin/env bash
# Set up (first run only) and start the Caliber dashboard on the bundled demo data
# (binds 127.0.0.1; `--address 0.0.0.0` to serve others, `-- --server.X=...` for Streamlit options).
source "$(dirname "$0")/_setup_env.sh" requirements.txt
exec .venv/bin/python -m caliber_core dashboard "$@"
