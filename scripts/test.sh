#!/usr/bin/env bash
# Set up (first run only) and run the whole test suite, browser tests included.
source "$(dirname "$0")/_setup_env.sh" requirements-dev.txt
# The browser tests drive Debian's Chromium (Playwright cannot download one here).
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "warning: /usr/bin/chromium missing and cannot be installed; browser tests will skip" >&2
  fi
fi
# The throttle's Redis tests start Debian's redis-server (they skip, saying why, without it).
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "warning: redis-server missing and cannot be installed; the Redis store tests will skip" >&2
  fi
fi
exec .venv/bin/python -m pytest "$@"
