"""Putting an override in front of one object's class, invisibly: the technique behind the loop and fetcher overrides.

Lightning's classes are never modified. One trainer's loop (or fetcher, or train ``CombinedLoader``) gets a class of
its own made of the mixin and the original class, named exactly as the original, so that what users see (profiler
action names such as
``[_TrainingEpochLoop].train_dataloader_next``, reprs, ``type(loop).__name__``) stays what stock Lightning shows;
and it pickles as an instance of the original class, without anything of ours.

The cost that matters is CPython's: an object whose class is changed loses the interpreter's fastest attribute reads
(see :func:`mix_in`), and Lightning reads its loops' and fetcher's attributes hundreds of times per training step. So
an object nothing refers to yet (the fetcher) gets a copy instead (:func:`mixed_copy`), and an override is put in
place only from when it is needed.
"""

from __future__ import annotations

import copyreg
from typing import Any, TypeVar

_MIXED_CLASSES: dict[tuple[type, type], type] = {}
_T = TypeVar("_T")

#: Instance attributes of ours, removed when the object is pickled.
OWN_ATTRIBUTE_PREFIX = "_midepoch"


def mix_in(obj: object, mixin: type) -> type:
    """Put ``mixin`` in front of ``obj``'s class, on this instance only. Returns the class to restore later.

    Example:
        >>> class Loop:
        ...     def run(self):
        ...         return "stock"
        >>> class Louder:
        ...     __reduce_ex__ = stock_reduce
        ...     def run(self):
        ...         return super().run().upper()
        >>> loop = Loop()
        >>> original = mix_in(loop, Louder)
        >>> loop.run(), type(loop).__name__, type(loop) is original
        ('STOCK', 'Loop', False)
        >>> import copy
        >>> type(copy.copy(loop)) is Loop
        True

    """
    original = type(obj)
    if issubclass(original, mixin):
        return original
    # (the mixin on Lightning's own loop, fetcher and CombinedLoader objects of one trainer: the design; never an
    # object of the user's)
    obj.__class__ = _mixed_class(mixin, original)
    # Assigning __class__ turns the attributes CPython keeps inline in the object into a "split" dict, on which the
    # interpreter's specialized attribute reads and writes fail every time (CPython 3.11): each of the hundreds of
    # reads of the loops' attributes per training step then takes the generic path, about as much time as all of
    # the callback's own work per step (measured). A plain dict of the same attributes keeps the reads specialized.
    obj.__dict__ = dict(vars(obj))
    return original


def mixed_copy(obj: _T, mixin: type, first: dict[str, Any] | None = None) -> tuple[_T, type]:
    """A new object of ``obj``'s class with ``mixin`` in front, with ``obj``'s attributes; and the class to restore.

    For an object that nothing else refers to yet: unlike :func:`mix_in`, the copy keeps its attributes inline, so
    that every attribute access stays as fast as on the stock object. Attributes are set one by one, through any
    property of the mixin, after those of ``first`` (the mixin's own, which its properties may need as the stock
    attributes are set). ``obj`` itself is left as it was.

    Example:
        >>> class Fetcher:
        ...     def __init__(self):
        ...         self.fetched = 3
        >>> class Counting:
        ...     pass
        >>> fetcher, original = mixed_copy(Fetcher(), Counting)
        >>> fetcher.fetched, type(fetcher).__name__, isinstance(fetcher, Counting), original is Fetcher
        (3, 'Fetcher', True, True)

    """
    original = type(obj)
    if issubclass(original, mixin):
        return obj, original
    copy: Any = object.__new__(_mixed_class(mixin, original))
    for name, value in [*(first or {}).items(), *vars(obj).items()]:
        setattr(copy, name, value)
    return copy, original


def _mixed_class(mixin: type, original: type) -> type:
    """The class of ``mixin`` in front of ``original``, named as ``original`` (one per pair)."""
    key = (mixin, original)
    if key not in _MIXED_CLASSES:
        names = {"__module__": original.__module__, "__qualname__": original.__qualname__, "_midepoch_stock": original}
        _MIXED_CLASSES[key] = type(original.__name__, (mixin, original), names)
    return _MIXED_CLASSES[key]


def unmix(obj: Any, original: type) -> None:
    """Give ``obj`` its original class back, with its attributes as the stock object has them."""
    state = stock_state(obj)
    obj.__class__ = original  # (undoes mix_in on Lightning's own object)
    vars(obj).clear()
    vars(obj).update(state)


def stock_state(obj: Any) -> dict[str, Any]:
    """An object's attributes as the stock object has them: without the mixin's own (``_midepoch...``)."""
    return {name: value for name, value in vars(obj).items() if not name.startswith(OWN_ATTRIBUTE_PREFIX)}


def stock_reduce(obj: Any, protocol: Any) -> Any:
    """``__reduce_ex__`` of the mixins: an object with an override pickles and copies as the stock object."""
    # copyreg's reconstructor (what pickle uses for protocols 0 and 1) creates the stock class without __init__; the
    # pickle names nothing of this package
    return copyreg._reconstructor, (type(obj)._midepoch_stock, object, None), stock_state(obj)  # type: ignore[attr-defined]
