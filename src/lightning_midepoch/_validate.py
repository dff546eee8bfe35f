"""Validation of a checkpoint's MidEpochResume state before anything reads it.

A state that was edited or corrupted after it was written must not reach the code that resumes from it, where a
wrong type or size surfaces as a ``KeyError`` or a torch ``RuntimeError`` deep inside a restore, or worse, is read
without an error and resumes inexactly. :func:`checked` checks a loaded state against the layout declared in
:data:`lightning_midepoch._schema.STATE`, then the facts that tie fields together (:data:`_RULES`), and answers the
first damage with one :class:`DamagedStateError` naming the field, what it should be and what it is.

Example:
    >>> checked({"version": 1, "loaders": [], "ranks": []})["ranks"]
    []
    >>> checked({"version": "1"})
    Traceback (most recent call last):
    ...
    lightning_midepoch._validate.DamagedStateError: ... damaged: `version`: expected an int >= 1, found a str ('1')...

"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lightning_midepoch import _state as S
from lightning_midepoch._schema import (
    _MISSING,
    EMPTY_KEYS,
    STATE,
    TORCH_CPU_STATE_BYTES,
    Int,
    Record,
    _Damage,
    _items,
    _key,
    describe,
)

__all__ = ["FIX", "TORCH_CPU_STATE_BYTES", "DamagedStateError", "check_grads", "checked", "describe"]

#: What to do about a damaged state, in every message that reports one.
FIX = (
    "The state was changed after it was written (edited, truncated or corrupted): resume from an earlier checkpoint,"
    " or pass `MidEpochResume(on_mismatch=\"restart_epoch\")` to resume without the callback's state (Lightning's own"
    " state is still restored; the data order and random states are then drawn afresh, as without the callback)."
)


class DamagedStateError(S.MidEpochResumeError):
    """The checkpoint's MidEpochResume state is not what any release writes: ``field`` is the first damage found."""

    def __init__(self, field: str, expected: str, found: str) -> None:
        self.field, self.expected, self.found = field, expected, found
        super().__init__(f"The checkpoint's MidEpochResume state is damaged: {self.problem} {FIX}")

    @property
    def problem(self) -> str:
        """Where the damage is, what the field should be and what it is, in one sentence."""
        where = f"`{self.field}`" if self.field else "the state"
        return f"{where}: expected {self.expected}, found {self.found}."


# ---------------------------------------------------------------------------------------------- cross-field rules
def _ranks_match_world_size(state: Mapping[str, Any]) -> None:
    # fewer entries than ranks: the states could not be exchanged (no process group when the file was written)
    ranks, world_size = state[S.KEY_RANKS], state[S.KEY_WORLD_SIZE]
    if not 1 <= len(ranks) <= world_size or all(rank is None for rank in ranks):
        count = "1 entry" if world_size == 1 else f"1 to {world_size} entries"
        raise _Damage(
            S.KEY_RANKS,
            f"a list of {count} (world_size is {world_size}), at least one of them a dict",
            describe(ranks) + (", all None" if ranks else ""),
        )


def _rank_lists_match_loaders(state: Mapping[str, Any]) -> None:
    loaders = len(state[S.KEY_LOADERS])
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        for key in (S.KEY_PASSES, S.KEY_GENERATORS, S.KEY_DATASET_STATES, S.KEY_DATASET_GENERATORS):
            if rank_state is not None and key in rank_state and len(rank_state[key]) != loaders:
                raise _Damage(
                    f"{S.KEY_RANKS}[{rank}].{key}",
                    f"a list of {_items(loaders)}, one per train dataloader (`{S.KEY_LOADERS}` has {loaders})",
                    describe(rank_state[key]),
                )


def _map_loaders_have_sizes(state: Mapping[str, Any]) -> None:
    for index, facts in enumerate(state[S.KEY_LOADERS]):
        for key in ("dataset_length", "num_batches"):
            if facts["kind"] == S.KIND_MAP and facts[key] is None:
                raise _Damage(f"{S.KEY_LOADERS}[{index}].{key}", "an int for a map-style dataloader", "None")


def _has_torch_generator(record: Mapping[str, Any]) -> bool:
    objects = {**record["at_iter"]["objects"], **record["at_first_next"]["objects"]}
    return any(state["kind"] == "torch" for state in objects.values())


def _check_random_record(
    spec: Mapping[str, Any] | None, record: Mapping[str, Any] | None, path: str, rebuilt: bool = False
) -> None:
    """A random order rebuilt from a pass record needs the states of its first draw, and its generator's.

    A pass record may lack the first draw (a checkpoint written before the pass's first ``next()``): a resume then
    draws it, and an elastic resume refuses it with a clear error; the record of an epoch already finished
    elastically (``rebuilt``) is always rebuilt.
    """
    if spec is None or spec["kind"] != "random" or record is None:
        return
    if record.get("at_first_next") is None:
        if rebuilt:
            found = describe(record.get("at_first_next", _MISSING))
            raise _Damage(_key(path, "at_first_next"), "the states of a random order's first draw (a dict)", found)
        return
    if spec["own_generator"] and not _has_torch_generator(record):
        raise _Damage(
            _key(_key(path, "at_iter"), "objects"),
            "the state of the torch generator its order spec says the sampler owns",
            "no torch generator state",
        )


def _random_orders_recorded(state: Mapping[str, Any]) -> None:
    specs = [facts["global_order"] for facts in state[S.KEY_LOADERS]]
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        for index, record in enumerate(rank_state[S.KEY_PASSES] if rank_state is not None else []):
            _check_random_record(specs[index], record, f"{S.KEY_RANKS}[{rank}].{S.KEY_PASSES}[{index}]")


def _elastic_matches_loaders(state: Mapping[str, Any]) -> None:
    elastic = state[S.KEY_ELASTIC]
    if elastic is None:
        return
    if elastic["spec"]["kind"] == "random" and elastic["record"] is None:
        raise _Damage(f"{S.KEY_ELASTIC}.record", "the pass record a random order is rebuilt from", "None")
    _check_random_record(elastic["spec"], elastic["record"], f"{S.KEY_ELASTIC}.record", rebuilt=True)
    loaders = state[S.KEY_LOADERS]
    length = loaders[0]["dataset_length"] if len(loaders) == 1 else None
    if elastic["dataset_length"] != length:
        raise _Damage(
            f"{S.KEY_ELASTIC}.dataset_length",
            f"the dataset length of the single train dataloader ({length})",
            describe(elastic["dataset_length"]),
        )


def _workers_match_their_count(state: Mapping[str, Any]) -> None:
    # a missing worker would start from fresh states on resume: silently inexact
    loaders = len(state[S.KEY_LOADERS])
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        entries = rank_state.get(S.KEY_WORKERS) if rank_state is not None else None
        path = f"{S.KEY_RANKS}[{rank}].{S.KEY_WORKERS}"
        if entries is not None and len(entries) > loaders:
            expected = f"a list of at most {_items(loaders)}, one per train dataloader"
            expected += f" (`{S.KEY_LOADERS}` has {loaders})"
            raise _Damage(path, expected, describe(entries))
        for index, entry in enumerate(entries or []):
            if entry is None:
                continue
            count, entry_path = entry["num_workers"], f"{path}[{index}]"
            for key in ("workers", "after_pass"):
                if key in entry and len(entry[key]) != count:
                    expected = f"a list of {_items(count)}, one per worker (num_workers is {count})"
                    raise _Damage(_key(entry_path, key), expected, describe(entry[key]))
            if entry.get("next_worker", 0) >= count:
                expected = f"a worker id from 0 to {count - 1} (num_workers is {count})"
                raise _Damage(_key(entry_path, "next_worker"), expected, describe(entry["next_worker"]))


#: Facts that tie fields together, checked in turn once every field has the right type.
_RULES: tuple[Callable[[Mapping[str, Any]], None], ...] = (
    _ranks_match_world_size,
    _rank_lists_match_loaders,
    _map_loaders_have_sizes,
    _random_orders_recorded,
    _elastic_matches_loaders,
    _workers_match_their_count,
)


# ---------------------------------------------------------------------------------------------- entry points
def _is_empty(state: Mapping[str, Any]) -> bool:
    """Whether a state is the one a trainer writes before it trained with the callback (it records nothing)."""
    return set(state) <= EMPTY_KEYS and all(state.get(key) == [] for key in (S.KEY_LOADERS, S.KEY_RANKS))


def _damaged(error: _Damage) -> DamagedStateError:
    return DamagedStateError(error.path, error.expected, error.found)


def checked(state: object) -> dict[str, Any]:
    """The state of a checkpoint brought to the current schema, once it is known to be intact.

    Raises:
        DamagedStateError: Naming the first field that no release of this package writes that way.
        MidEpochResumeError: If the state comes from a newer release (see :func:`~lightning_midepoch._state.migrate`).

    """
    try:
        Record(fields={S.KEY_VERSION: Int(1)}).check(state, "")
    except _Damage as error:
        raise _damaged(error) from None
    migrated = S.migrate(state)  # type: ignore[arg-type]
    try:
        if not _is_empty(migrated):
            STATE.check(migrated, "")
            for rule in _RULES:
                rule(migrated)
    except _Damage as error:
        raise _damaged(error) from None
    return migrated


def check_grads(state: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Check every rank's partial gradients of an intact state against the model's parameter shapes.

    Raises:
        DamagedStateError: If a gradient names no parameter of the model or has another shape than its parameter.

    """
    for rank, rank_state in enumerate(state[S.KEY_RANKS]):
        grads = rank_state[S.KEY_GRADS] if rank_state is not None else None
        for name, grad in (grads or {}).items():
            path = f"{S.KEY_RANKS}[{rank}].{S.KEY_GRADS}[{name!r}]"
            if name not in shapes:
                expected = "the gradient of one of the model's parameters"
                raise DamagedStateError(path, expected, "no parameter of that name")
            if tuple(grad.shape) != tuple(shapes[name]):
                raise DamagedStateError(
                    path, f"a tensor of shape {tuple(shapes[name])} (the parameter's)", describe(grad)
                )
