"""An OpenAI-compatible gateway in front of ``vllm serve``: it authenticates each account, decides its level, signs it.

* :mod:`.identity`     who is calling: an API key in the accounts file, or a trusted proxy's header
* :mod:`.request_rules` what the gateway accepts: the body, the rows it counts, what it refuses
* :mod:`.app`          the FastAPI app proxying ``/v1/completions`` and ``/v1/chat/completions`` (streaming too)
* ``caliber gateway --upstream URL --policy P --key-file K --store URI --accounts FILE``
  (:mod:`caliber_core.cli.gateway`)

FastAPI, httpx and uvicorn are imported by :mod:`.app` and the command only
(the ``gateway`` extra).
"""
