"""A package's public names, each imported from its module on first use (PEP 562).

A package ``__init__`` that imported its submodules at once would be a module
that every submodule imports back (importing ``pkg.mod`` runs ``pkg`` first):
handing the names on lazily keeps the import graph one-way, and importing a
package costs nothing until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package that hands ``names`` on.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    names : Mapping[str, str]
        Public name -> the module that defines it, relative to ``package``
        (``"loading.load"``, or ``"policy"``); ``"module:attribute"`` hands on
        a name the module defines under another name.

    Returns
    -------
    (__getattr__, __dir__) : tuple of callables
        To be bound at module level in the package's ``__init__``.

    Raises
    ------
    AttributeError
        From ``__getattr__``, for a name not in ``names``.
    """
    module = importlib.import_module(package)

    def __getattr__(name: str):
        source = names.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        source, _, attribute = source.partition(":")
        value = getattr(importlib.import_module(f"{package}.{source}"), attribute or name)
        setattr(module, name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(names))

    return __getattr__, __dir__
