"""The command line, ``caliber`` (``python -m caliber_core``): one module per subcommand.

* :mod:`.commands`   the parser of every subcommand, ``main``, errors to exit statuses
* :mod:`.arguments`  the argument types and options the subcommands share (one rule each)
* :mod:`.calibrate`, :mod:`.check`, :mod:`.fleet`, :mod:`.attack`, :mod:`.extract`, :mod:`.gateway`,
  :mod:`.keygen`, :mod:`.throttle`, :mod:`.gateway`, :mod:`.dashboard`  one subcommand each:
  ``add_parser(subparsers)`` and ``run(args) -> int``

The names below are handed on from their modules on first use.
"""

from ..lazy_names import lazy_names

_NAMES = {"main": "commands", "build_parser": "commands", "EXIT_USER_ERROR": "commands", "EXIT_INTERNAL": "commands",
          "EXIT_DRIFT": "check"}
__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)
