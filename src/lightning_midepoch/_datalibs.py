"""What the callback knows of data libraries beyond torch: Hugging Face ``datasets`` and litdata.

Their iterable datasets and loaders save their own positions (``state_dict``), which Lightning restores; a few of
their ways are worth knowing to resume them as the uninterrupted run went on: a shuffle buffer their state leaves out
(:func:`unsaved_buffer`), a loaded position kept beyond the pass it was for (:func:`forget_restored_position`), a
state that describes the previous pass until a new one fetches (:func:`lags_a_pass`). Each is read from the versions
named, duck-typed: anything else is left alone. Their private names are listed in :mod:`lightning_midepoch._private`.
"""

from __future__ import annotations


def unsaved_buffer(dataset: object) -> str | None:
    """What an iterable dataset holds that its own ``state_dict()`` leaves out, if known: a shuffle buffer.

    Hugging Face's ``datasets.IterableDataset.shuffle(buffer_size=...)`` draws from a buffer of examples that its
    state does not hold: a restored dataset refills it, so examples of the interrupted epoch are lost and others are
    seen twice. The buffer is an example iterable with a ``buffer_size`` along the dataset's chain of them
    (``_ex_iterable``, then ``ex_iterable``/``ex_iterables``; read from ``datasets`` 5.2.0, duck-typed).

    Example:
        >>> unsaved_buffer(range(3)) is None
        True

    """
    pending = [getattr(dataset, "_ex_iterable", None)]
    for _ in range(64):  # a chain of example iterables (mapped, filtered, interleaved, ...), bounded
        if not pending:
            break
        node = pending.pop()
        size = getattr(node, "buffer_size", None)
        if isinstance(size, int):
            return f"a shuffle buffer of {size} examples"
        pending.append(getattr(node, "ex_iterable", None))
        children = getattr(node, "ex_iterables", None)
        pending += list(children) if isinstance(children, (list, tuple)) else []
        pending = [child for child in pending if child is not None]
    return None


def forget_restored_position(obj: object) -> None:
    """Let a dataset or loader that was given a saved position start its next pass afresh, as it does when not resumed.

    Two libraries keep a loaded position beyond the pass it was for:

    * Hugging Face's ``datasets.IterableDataset.load_state_dict`` keeps the state (``_starting_state_dict``) and applies
      it at every pass whose epoch is the state's; Lightning never moves that epoch (it calls ``set_epoch`` on
      samplers only), so every later pass would start at the restored position.
    * litdata's ``StreamingDataLoader`` stays in its ``restore`` mode until an iterator runs to its very end, which
      Lightning's loop never asks of a sized loader (it stops after ``len(loader)`` batches): its next pass would replay
      the restored position instead of starting its next epoch.

    Read from ``datasets`` 5.2.0 and ``litdata`` 0.2.76; anything else is left alone.

    Example:
        >>> class Restored:
        ...     _starting_state_dict = {"epoch": 0}
        >>> dataset = Restored()
        >>> forget_restored_position(dataset)
        >>> dataset._starting_state_dict is None
        True

    """
    if isinstance(getattr(obj, "_starting_state_dict", None), dict):
        obj._starting_state_dict = None  # type: ignore[attr-defined]
    if type(obj).__module__.split(".")[0] == "litdata" and getattr(obj, "restore", None) is True:
        obj.restore = False  # type: ignore[attr-defined]


def lags_a_pass(dataset: object) -> bool:
    """Whether a dataset's ``state_dict()`` still describes its previous pass until a new pass fetches.

    Hugging Face's ``datasets.IterableDataset`` sets up a pass's state at the pass's first example (read from
    ``datasets`` 5.2.0: the loaded state it keeps, ``_starting_state_dict``, marks it).

    Example:
        >>> lags_a_pass(range(3))
        False

    """
    return hasattr(dataset, "_starting_state_dict")
