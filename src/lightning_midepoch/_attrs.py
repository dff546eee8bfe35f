"""Looking at a user's objects without making them slower: whether an object keeps a value of some kind.

The searches for samplers and generators look at the attributes of every object a loader keeps, its dataset
included. Reading an object's ``__dict__`` is not free of consequences in CPython 3.11 and 3.12: the attributes
CPython keeps inside the object are moved into a dict that the interpreter's specialized attribute reads cannot use,
and every later ``self.x`` of that object takes the generic path, several times slower. A dataset reads its
attributes at every sample, in the main process: a search that merely looked at it would slow the training down
for the rest of the fit. So an object is looked into through the garbage collector's view of it, which lists the
values without moving them; ``__dict__`` is read only where that view is ambiguous, or by a caller that needs the
names (an object on the sampler chain, read once per epoch).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any


class _Plain:
    pass


def _layout(cls: type) -> tuple[int, int, int]:
    return cls.__basicsize__, cls.__dictoffset__, cls.__weakrefoffset__


#: How CPython lays out an instance of a class with no slots and no C base (where it keeps the dict varies by version)
_PLAIN_LAYOUT = _layout(_Plain)


def holds(obj: Any, kind: type | tuple[type, ...]) -> bool:
    """Whether one of ``obj``'s attributes (those in its ``__dict__``) is an instance of ``kind``.

    Example:
        >>> class Dataset:
        ...     def __init__(self):
        ...         self.samples, self.size = [1, 2], 2
        >>> dataset = Dataset()
        >>> holds(dataset, list), holds(dataset, str)
        (True, False)
        >>> import gc
        >>> any(isinstance(ref, dict) for ref in gc.get_referents(dataset))  # its attributes are still inline
        False

    """
    return any(isinstance(value, kind) for value in attribute_values(obj))


def first(obj: Any, predicate: Callable[[Any], bool]) -> Any:
    """The first of ``obj``'s attributes, in their order, for which ``predicate`` is true (None if none is).

    ``__dict__`` is read only where more than one value is, to know which came first.

    Example:
        >>> class Wrapper:
        ...     def __init__(self):
        ...         self.name, self.inner, self.size = "w", [1], 2
        >>> first(Wrapper(), lambda value: isinstance(value, (int, list)))
        [1]

    """
    matches = [value for value in attribute_values(obj) if predicate(value)]
    if len(matches) > 1:
        return next(value for value in vars(obj).values() if predicate(value))
    return matches[0] if matches else None


def attribute_values(obj: Any) -> list[Any]:
    """The values of ``obj``'s attributes (those in its ``__dict__``), in no particular order.

    Read as :func:`holds` reads them: through ``__dict__`` only where the collector's view of ``obj`` is ambiguous.
    """
    cls = type(obj)
    # An instance of a class laid out as a plain class (no slots, no C base) shows the collector its class and either
    # its attribute values, where CPython keeps them inline (3.11 and later), or the dict that holds them. A single
    # dict is ambiguous (it may be the one attribute): then __dict__ is read.
    if _layout(cls) == _PLAIN_LAYOUT:
        values = [ref for ref in gc.get_referents(obj) if ref is not cls]
        if not (len(values) == 1 and type(values[0]) is dict):
            return values
    attrs = getattr(obj, "__dict__", None)
    return list(attrs.values()) if isinstance(attrs, dict) else []
