"""Loaded JSON documents: depth guards, and read-only containers no reader can change for another.

``FrozenDict`` and ``FrozenList`` are a ``dict`` and a ``list`` (``isinstance``,
``json.dumps`` and equality work as for the parsed JSON) whose mutators raise
``TypeError``; ``copy.deepcopy`` of one is the plain, mutable container.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping


def refuse(self, *args, **kwargs):
    """Every mutator of a frozen container.

    Parameters
    ----------
    self : Frozen
        The container.
    *args, **kwargs
        Whatever the mutator was called with (ignored).

    Raises
    ------
    TypeError
        Always: the container is read-only.
    """
    raise TypeError(f"a loaded {type(self).__name__} is read-only: copy.deepcopy() it for a plain, "
                    "mutable copy")


class Frozen:
    """Mutators refused; ``copy.deepcopy`` gives the plain, mutable container back.

    A mixin without state: every mutating method is :func:`refuse`.
    """

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = __ior__ = refuse
    append = extend = insert = remove = sort = reverse = refuse
    update = pop = popitem = clear = setdefault = refuse


class FrozenList(Frozen, list):
    """A read-only list; built by :func:`frozen`.

    Parameters
    ----------
    iterable : iterable
        The items (already frozen where they are containers).
    """

    __slots__ = ()

    def __deepcopy__(self, memo) -> list:
        return [copy.deepcopy(v, memo) for v in self]

    def __reduce__(self):
        return frozen, ([*self],)


class FrozenDict(Frozen, dict):
    """A read-only dict; built by :func:`frozen`.

    Parameters
    ----------
    mapping : Mapping
        The items (already frozen where they are containers).
    """

    __slots__ = ()

    def __deepcopy__(self, memo) -> dict:
        return {k: copy.deepcopy(v, memo) for k, v in self.items()}

    def __reduce__(self):
        return frozen, (dict(self),)


def frozen(obj):
    """``obj`` with every dict and list in it frozen (other values as they are).

    Parameters
    ----------
    obj : object
        A parsed JSON value (any mapping counts as a dict).

    Returns
    -------
    FrozenDict, FrozenList or object
        A frozen copy of a container, walked all the way down; any other value itself.
    """
    if isinstance(obj, Mapping):
        return FrozenDict({k: frozen(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return FrozenList(frozen(v) for v in obj)
    return obj


def json_depth(text: str) -> int:
    """Deepest bracket nesting of JSON text (strings skipped), without recursion.

    Parameters
    ----------
    text : str
        JSON text, not yet parsed (it need not be valid).

    Returns
    -------
    int
        The largest number of open ``[`` / ``{`` at any point; 0 for a scalar.
    """
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def nested_deeper(obj, limit: int) -> bool:
    """Whether a parsed JSON value nests more than ``limit`` containers deep.

    Parameters
    ----------
    obj : object
        A parsed JSON value.
    limit : int
        The deepest nesting allowed.

    Returns
    -------
    bool
        True as soon as a container lies below ``limit`` others (the walk
        stops at depth limit + 1).
    """
    if isinstance(obj, (dict, list)):
        if limit <= 0:
            return True
        children = obj.values() if isinstance(obj, dict) else obj
        return any(nested_deeper(child, limit - 1) for child in children)
    return False
