"""A damaged or hand-edited MidEpochResume state: one MidEpochResumeError naming the field, never a crash inside.

Real checkpoints are written once per module; every test edits a copy. Hypothesis draws damage to their states
(keys deleted, values of another type, lists and tensors cut or grown, tensors of another dtype or shape, negative
or huge ints, ...): the validator either names a field that exists, or accepts the state, and then everything a
resume reads from it works on throwaway objects (or stops with a MidEpochResumeError).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import random
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import Config, CrashPoint, checkpoint_path, run
from lightning_midepoch import MidEpochResume, MidEpochResumeError, _elastic, _rng
from lightning_midepoch import _schema as Schema
from lightning_midepoch import _state as S
from lightning_midepoch import _validate as V
from lightning_midepoch.__main__ import main
from lightning_midepoch._inspect import analyse
from lightning_midepoch._order import _PassRecord

CRASH = CrashPoint("train_batch_end", epoch=1, batch=3)
EPOCH_START = CrashPoint("train_epoch_start", epoch=1)
#: two train loaders with their own generators, inside a gradient accumulation group: every part of a rank's state
TWO_LOADERS = Config(loader="sampler_generator", combined="max_size_cycle", accumulate_grad_batches=3)
ONE_LOADER = Config(loader="sampler_generator")
#: a dataset drawing augmentation in 2 DataLoader workers: the workers' states (their dataset copies own a generator)
WORKERS = Config(augment=True, num_workers=2, max_epochs=2)
#: the same dataset read in the main process: its own generator's states
MAIN_PROCESS = Config(augment=True, num_workers=0, max_epochs=2)
STATE_KEY = "MidEpochResume"
DAMAGED = "The checkpoint's MidEpochResume state is damaged"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real mid-epoch checkpoints, written once for the module; tests only ever edit copies."""
    paths = {}
    for name, config, crash in (
        ("two_loaders", TWO_LOADERS, CRASH),
        ("one_loader", ONE_LOADER, CRASH),
        ("epoch_start", TWO_LOADERS, EPOCH_START),  # the epoch's passes have not drawn their orders yet
        ("workers", WORKERS, CRASH),
        ("main_process", MAIN_PROCESS, CRASH),
    ):
        directory = tmp_path_factory.mktemp(name)
        assert run(config, directory, crash=crash).crashed
        paths[name] = checkpoint_path(directory, crash)
    return paths


def load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def _with_two_ranks(state: dict[str, Any]) -> dict[str, Any]:
    """The state as a 2-process run writes it (rank 1 holds the same kinds of states as rank 0), with a dataset
    state and generators of every kind ``_rng`` captures."""
    rank_1 = copy.deepcopy(state["ranks"][0])
    rank_1["dataset_states"][1] = {"position": 3}
    generators = {
        "dataset.rng": np.random.default_rng(3),
        "dataset.legacy": np.random.RandomState(4),
        "dataset.python": random.Random(5),
    }
    rank_1["generators"][1].update(_rng.capture_objects(generators))
    return {**state, "world_size": 2, "ranks": [state["ranks"][0], rank_1]}


def _with_elastic(state: dict[str, Any]) -> dict[str, Any]:
    """The state of a single-loader epoch already resumed once on 2 devices, built from the real state's parts."""
    facts = state["loaders"][0]
    layout = {"world_size": 2, "drop_last": False, "batch_size": 2, "batch_drop_last": False}
    elastic = {
        "epoch": state["epoch"],
        "spec": facts["global_order"],
        "dataset_length": facts["dataset_length"],
        "record": copy.deepcopy(state["ranks"][0]["passes"][0]),
        "phases": [{**layout, "world_size": 1, "consumed": 8}],
        "current": {**layout, "batch_offset": 4},
    }
    return {**state, "elastic": elastic}


@pytest.fixture(scope="module")
def checkpoints(written: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """The loaded checkpoints with the states the damage is drawn from (read-only: tests damage copies)."""
    two_loaders, one_loader = load(written["two_loaders"]), load(written["one_loader"])
    two_loaders["callbacks"][STATE_KEY] = _with_two_ranks(two_loaders["callbacks"][STATE_KEY])
    one_loader["callbacks"][STATE_KEY] = _with_elastic(one_loader["callbacks"][STATE_KEY])
    workers, main_process = load(written["workers"]), load(written["main_process"])
    return _Quiet(two_ranks=two_loaders, elastic=one_loader, workers=workers, main_process=main_process)


class _Quiet(dict):  # type: ignore[type-arg]
    def __repr__(self) -> str:  # what hypothesis prints of a fixture or a strategy's argument: not whole states
        return f"<{sorted(self)}>"


@pytest.fixture(scope="module")
def states(checkpoints: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return _Quiet({name: checkpoint["callbacks"][STATE_KEY] for name, checkpoint in checkpoints.items()})


# ---------------------------------------------------------------------------------------------- drawing damage
Key = str | int
_DELETE = object()


def _paths(node: Any, prefix: tuple[Key, ...] = ()) -> list[tuple[Key, ...]]:
    """Every place in a state, parents first (tensors are leaves)."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*prefix, index))
    return found


def _get(state: Any, path: tuple[Key, ...]) -> Any:
    for key in path:
        state = state[key]
    return state


def _set(state: Any, path: tuple[Key, ...], value: Any) -> None:
    parent, key = _get(state, path[:-1]), path[-1]
    if value is _DELETE:
        del parent[key]
    else:
        parent[key] = value


#: Values of every type a state holds, and some it never holds.
_FOREIGN = [None, "", "abcd", -1, 0, 1, 625, 2**40, 0.5, True, [], [None], {}, {"kind": "torch"}, (1, 2)]
_DTYPES = [torch.uint8, torch.int32, torch.int64, torch.float32]


def _variants(value: Any) -> list[tuple[str, Callable[[Any], Any]]]:
    """Ways to damage ``value``, by name (so that hypothesis reports readable examples)."""
    found: list[tuple[str, Callable[[Any], Any]]] = [("delete", lambda _: _DELETE)]
    found += [(f"replace by {foreign!r}", lambda _, foreign=foreign: copy.deepcopy(foreign)) for foreign in _FOREIGN]
    if isinstance(value, list):
        found += [
            ("drop the last item", lambda v: v[:-1]),
            ("repeat the last item", lambda v: v + copy.deepcopy(v[-1:])),
            ("append None", lambda v: [*v, None]),
            ("make a str of it", lambda v: "x" * len(v)),
            ("make a tuple of it", tuple),
        ]
    elif isinstance(value, torch.Tensor):
        found += [
            ("drop the last element", lambda v: v[:-1]),
            ("append an element", lambda v: torch.cat([v, v[-1:]])),
            ("make it 2-D", lambda v: v.reshape(1, -1)),
            ("empty it", lambda v: v[:0]),
            ("raise the last element", lambda v: torch.cat([v[:-1], torch.full(v[-1:].shape, 1000).to(v.dtype)])),
        ]
        found += [(f"cast to {dtype}", lambda v, dtype=dtype: v.to(dtype)) for dtype in _DTYPES]
    elif isinstance(value, bool):
        found += [("flip", lambda v: not v), ("make an int of it", int)]
    elif isinstance(value, int):
        found += [("negate", lambda v: -v - 1), ("add one", lambda v: v + 1), ("make a str of it", str)]
        found += [("make a float of it", float)]
    elif isinstance(value, str):
        found += [("append text", lambda v: v + "x"), ("make a list of it", list)]
    elif isinstance(value, dict):
        found += [("add an unknown key", lambda v: {**v, "unknown": 1}), ("make a list of it", lambda v: [*v.values()])]
    return found


@st.composite
def damaged(draw: st.DrawFn, states: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any], list[str]]:
    """One of the real states with one to three places damaged; also returns what was done."""
    name = draw(st.sampled_from(sorted(states)))
    state = copy.deepcopy(states[name])
    done = []
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(state)[1:]))
        how, change = draw(st.sampled_from(_variants(_get(state, path))))
        _set(state, path, change(_get(state, path)))
        done.append(f"{how} at {path}")
    return name, state, done


# ---------------------------------------------------------------------------------------------- oracles
_TOKEN = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]")


def _field_tokens(field: str) -> list[Key]:
    tokens: list[Key] = []
    position = 0
    while position < len(field):
        match = _TOKEN.match(field, position)
        assert match is not None, f"{field!r} is not a field path (at {position})"
        name, index, quoted = match.groups()
        tokens.append(name if name is not None else int(index) if index is not None else ast.literal_eval(quoted))
        position = match.end()
    return tokens


def assert_names_a_field(error: V.DamagedStateError, state: dict[str, Any]) -> None:
    """The error names a field of ``state`` (or a missing key of a dict in it) and says what to do."""
    message = str(error)
    assert message.startswith(f"{DAMAGED}: `{error.field}`: expected ")
    assert 'on_mismatch="restart_epoch"' in message
    assert "earlier checkpoint" in message
    *parents, last = _field_tokens(error.field)
    parent = _get(state, tuple(parents))
    if error.found == "nothing (the key is missing)":
        assert isinstance(parent, dict)
        assert last not in parent
    else:
        assert isinstance(parent, (dict, list))
        _get(parent, (last,))  # the field exists


def _fresh(state: dict[str, Any]) -> Any:
    """A new generator object of the kind a saved generator state is for."""
    kind = state["kind"]
    if kind == "torch":
        return torch.Generator()
    if kind == "python":
        return random.Random()
    if kind == "numpy_legacy":
        return np.random.RandomState()
    return np.random.Generator(getattr(np.random, state["state"]["bit_generator"])())


def _restore_objects(states: dict[str, Any]) -> None:
    for path, state in states.items():
        assert _rng.restore_objects({path: _fresh(state)}, {path: state}) == []


#: The resumed run of :func:`resume_pieces`: 2 devices, as the two-rank state was written on and the elastic one
#: was being finished on.
WORLD_SIZE = 2


def resume_pieces(state: dict[str, Any], written: dict[str, Any], parameters: dict[str, torch.Tensor]) -> None:
    """Everything a resume of the same loaders reads from an accepted state, on throwaway objects.

    Mirrors ``_Session``: the loaders' facts are compared first, then the random states are restored, the pass
    records replayed, the partial gradients put into parameters and an elastic epoch laid out.
    """
    if not S.records_position(state):
        return
    elastic = bool(state["elastic"]) or state["world_size"] != WORLD_SIZE
    S.check_loaders(state["loaders"], written["loaders"], "fix", same_world_size=not elastic)
    V.check_grads(state, {name: tuple(value.shape) for name, value in parameters.items()})
    with _rng.isolated_global():
        for rank_state in state["ranks"]:
            if rank_state is not None:
                _restore_rank(rank_state, parameters)
        for facts in state["loaders"]:
            if facts["kind"] == S.KIND_MAP:
                S.loader_position(state["mode"], state["fetched"], facts["num_batches"])
        if elastic:
            _lay_out_elastic_epoch(state)


def _restore_rank(rank_state: dict[str, Any], parameters: dict[str, torch.Tensor]) -> None:
    _rng.restore_global(rank_state["rng"])
    for objects in rank_state["generators"]:
        _restore_objects(objects or {})
    for record in rank_state["passes"]:
        if record is not None:
            replay = _PassRecord.from_state_dict(record)
            _rng.restore_global(replay.at_iter["global"])
            _restore_objects(replay.at_iter["objects"])
            if replay.at_first_next is not None:
                _rng.restore_global(replay.first_next_states()["global"])
                _restore_objects(replay.first_next_states()["objects"])
    for name, grad in (rank_state["grads"] or {}).items():
        parameter = torch.zeros_like(parameters[name], requires_grad=True)
        parameter.grad = grad.to(dtype=parameter.dtype)
    for entry in rank_state.get("workers") or []:  # what a resumed worker loads (_workers._WorkerInit)
        for worker in [*entry["workers"], *entry.get("after_pass", [])] if entry is not None else []:
            if worker["state"] is not None:
                _rng.restore_global(worker["state"]["global"])
                _restore_objects(worker["state"]["objects"])


def _lay_out_elastic_epoch(state: dict[str, Any]) -> None:
    """As ``_Session._check_checkpoint`` and ``_start_elastic_epoch`` do, on rank 1 of 2."""
    previous, epoch = state["elastic"], state["epoch"]
    rank_0 = state["ranks"][0]
    record = rank_0["passes"][0] if rank_0 is not None and rank_0["passes"] else None
    recorded = (previous is not None and previous["epoch"] == epoch) or (
        record is not None and record["epoch"] == epoch and record["at_first_next"] is not None
    )
    S.check_elastic(state["loaders"], state["world_size"], WORLD_SIZE, "fix", recorded)
    if previous is not None and previous["epoch"] == epoch:
        elastic = {**previous, "phases": [*previous["phases"], {**previous["current"], "consumed": 2}]}
    else:
        facts = state["loaders"][0]
        spec, batch_size = facts["global_order"], facts["batch_size"] or 1
        phase = {
            "world_size": state["world_size"],
            "drop_last": spec["kind"] == "distributed" and spec["drop_last"],
            "batch_size": batch_size,
            "batch_drop_last": spec["batch_drop_last"],
            "consumed": state["fetched"] * batch_size,
        }
        elastic = {"spec": spec, "dataset_length": facts["dataset_length"], "record": record, "phases": [phase]}
    order = _elastic.global_order(elastic["spec"], elastic["dataset_length"], epoch, elastic["record"])
    left = _elastic.remaining(order, elastic["phases"])
    _elastic.batched(_elastic.shard(left, 1, WORLD_SIZE, drop_last=False), 2, drop_last=False)


# ---------------------------------------------------------------------------------------------- the property
@settings(max_examples=10 * settings.default.max_examples, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damage_is_named_or_harmless(checkpoints, states, data):
    name, state, done = data.draw(damaged(states), label="damaged state")
    checkpoint = checkpoints[name]
    report = analyse({**checkpoint, "callbacks": {STATE_KEY: state}}, "damaged.ckpt")
    accepted, error = _outcome(state)
    if isinstance(error, V.DamagedStateError):
        assert_names_a_field(error, state)
        assert report.verdict == "not_possible"
        assert f"{DAMAGED}: `{error.field}`: expected" in report.blockers[0].reason  # inspect says the same
        return
    if error is not None:
        assert state["version"] > S.STATE_VERSION, done
        assert "Upgrade lightning-midepoch" in str(error)
        return
    assert report.verdict != "not_possible" or "is not the checkpoint's" in report.blockers[0].reason, done
    # a clear error a resume stops with (a changed fact, or an epoch that cannot be re-sharded) is fine
    with contextlib.suppress(MidEpochResumeError):
        resume_pieces(accepted, states[name], checkpoint["state_dict"])


def _outcome(state: dict[str, Any]) -> tuple[dict[str, Any] | None, MidEpochResumeError | None]:
    try:
        return V.checked(state), None
    except MidEpochResumeError as error:
        return None, error


def test_the_written_states_are_intact(states, written):
    for state in (*states.values(), *(load(path)["callbacks"][STATE_KEY] for path in written.values())):
        assert V.checked(state) == S.migrate(state)


def _undeclared(spec: Any, value: Any, path: str) -> list[str]:
    """The keys under ``value`` that the schema does not declare (it allows them, but no release should write them)."""
    spec = spec.spec if isinstance(spec, (Schema.Field, Schema.Optional)) else spec
    if value is None:
        return []
    if isinstance(spec, Schema.List):
        return [key for index, item in enumerate(value) for key in _undeclared(spec.item, item, f"{path}[{index}]")]
    if isinstance(spec, Schema.DictOf):
        return [key for name, item in value.items() for key in _undeclared(spec.value, item, f"{path}[{name!r}]")]
    if isinstance(spec, Schema._GlobalNumpy):
        return _undeclared(Schema._NUMPY_MT19937 if value["name"] == "MT19937" else spec.other, value, path)
    if isinstance(spec, Schema.Tagged):
        untagged = {name: item for name, item in value.items() if name != spec.tag}
        return _undeclared(spec.records[value[spec.tag]], untagged, path)
    if isinstance(spec, Schema.Record):
        declared = {**spec.fields, **spec.optional}
        return [
            key
            for name, item in value.items()
            for key in (_undeclared(declared[name], item, f"{path}.{name}") if name in declared else [f"{path}.{name}"])
        ]
    return []


def test_every_key_a_state_is_written_with_is_declared_in_the_schema(written):
    """The schema is the whole layout: nothing the callback writes is left out of it (or it would pass unchecked)."""
    for path in written.values():
        assert _undeclared(Schema.STATE, load(path)["callbacks"][STATE_KEY], "") == []


def test_legacy_states_are_intact():
    checkpoints = sorted((Path(__file__).parent / "legacy" / "checkpoints").glob("*.ckpt"))
    assert checkpoints
    for path in checkpoints:
        V.checked(load(path)["callbacks"][STATE_KEY])


# ---------------------------------------------------------------------------------------------- the messages
def _rank_0(state: dict[str, Any]) -> dict[str, Any]:
    return state["ranks"][0]


GENERATOR = "loader.sampler.generator"


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda s: s.pop("fetched"), "`fetched`: expected an int >= 0, found nothing (the key is missing)."),
        (
            lambda s: s.update(loaders="abcd"),
            "`loaders`: expected a list (one dict of facts per train dataloader), found a str ('abcd').",
        ),
        (
            lambda s: _rank_0(s)["rng"].update(torch=_rank_0(s)["rng"]["torch"][:100]),
            f"`ranks[0].rng.torch`: expected a uint8 tensor of shape ({V.TORCH_CPU_STATE_BYTES},) (a CPU generator's"
            " state), found a uint8 tensor of shape (100,).",
        ),
        (
            lambda s: _rank_0(s)["rng"]["numpy"].update(keys=_rank_0(s)["rng"]["numpy"]["keys"].long()),
            "`ranks[0].rng.numpy.keys`: expected an int32 tensor of shape (624,), found an int64 tensor of shape"
            " (624,).",
        ),
        (lambda s: _rank_0(s)["rng"]["numpy"].update(pos=625), "`ranks[0].rng.numpy.pos`: expected an int from 0 to"),
        (
            lambda s: _rank_0(s)["rng"]["python"]["state"].__setitem__(-1, 700),
            "`ranks[0].rng.python.state`: expected an int32 tensor of shape (625,) (624 words and a position from 0"
            " to 624), found a position of 700.",
        ),
        (
            lambda s: s.update(ranks=[]),
            "`ranks`: expected a list of 1 to 2 entries (world_size is 2), at least one of them a dict, found an"
            " empty list.",
        ),
        (
            lambda s: s.update(ranks=[None, None]),
            "`ranks`: expected a list of 1 to 2 entries (world_size is 2), at least one of them a dict, found a list"
            " of 2 items, all None.",
        ),
        (
            lambda s: _rank_0(s)["passes"][0].update(index="0"),
            "`ranks[0].passes[0].index`: expected an int >= 0, found a str ('0').",
        ),
        (
            lambda s: _rank_0(s)["passes"].pop(),
            "`ranks[0].passes`: expected a list of 2 items, one per train dataloader (`loaders` has 2), found a list"
            " of 1 item.",
        ),
        (
            lambda s: _rank_0(s)["passes"].__setitem__(1, "record"),
            "`ranks[0].passes[1]`: expected None or a pass record (a dict), found a str ('record').",
        ),
        (
            lambda s: _rank_0(s)["passes"][0]["at_iter"]["objects"].clear(),
            "`ranks[0].passes[0].at_iter.objects`: expected the state of the torch generator its order spec says",
        ),
        (
            lambda s: _rank_0(s)["generators"][0][GENERATOR].update(kind="mt"),
            f"`ranks[0].generators[0]['{GENERATOR}'].kind`: expected 'torch' or 'python' or 'numpy_legacy' or"
            " 'numpy', found a str ('mt').",
        ),
        (
            lambda s: s["ranks"][1]["generators"][1]["dataset.rng"]["state"]["state"].update(inc="x"),
            "`ranks[1].generators[1]['dataset.rng'].state`: expected a state numpy's PCG64 accepts, found one it",
        ),
        (
            lambda s: s["ranks"][1]["generators"][1]["dataset.legacy"]["state"]["state"]["key"].update(dtype="int8"),
            "`ranks[1].generators[1]['dataset.legacy'].state.state.key.dtype`: expected 'uint32', found a str",
        ),
        (
            lambda s: s["ranks"][1]["dataset_states"].__setitem__(1, [3]),
            "`ranks[1].dataset_states[1]`: expected None or a dict, found a list of 1 item.",
        ),
        (
            lambda s: _rank_0(s)["grads"].update({"net.0.weight": _rank_0(s)["grads"]["net.0.weight"].long()}),
            "`ranks[0].grads['net.0.weight']`: expected a floating-point tensor, found an int64 tensor of shape"
            " (16, 4).",
        ),
        (
            lambda s: _rank_0(s)["passes"][0]["at_iter"].update(extra=1),
            "`ranks[0].passes[0].at_iter.extra`: expected no such key (this dict holds only 'global', 'objects'),"
            " found one.",
        ),
        (
            lambda s: _rank_0(s)["generators"][0].update({3: {}}),
            "`ranks[0].generators[0]`: expected a dict (generator states by path) with str keys, found a key that is"
            " an int (3).",
        ),
        (
            lambda s: s["ranks"][1]["generators"][1]["dataset.rng"]["state"].update(bit_generator="Mersenne"),
            "`ranks[1].generators[1]['dataset.rng'].state`: expected the state of a numpy bit generator (a dict"
            " naming it in 'bit_generator'), found a dict.",
        ),
        (lambda s: s.update(world_size=True), "`world_size`: expected an int >= 1, found a bool (True)."),
        (lambda s: s.update(stopped=1), "`stopped`: expected a bool, found an int (1)."),
        (
            lambda s: s["loaders"][1].update(dataset_length=None),
            "`loaders[1].dataset_length`: expected an int for a map-style dataloader, found None.",
        ),
        (
            lambda s: s["loaders"][0]["global_order"].pop("kind"),
            "`loaders[0].global_order.kind`: expected 'distributed' or 'sequential' or 'random', found nothing",
        ),
    ],
)
def test_damage_is_named(states, damage, problem):
    state = copy.deepcopy(states["two_ranks"])
    damage(state)
    with pytest.raises(V.DamagedStateError) as raised:
        V.checked(state)
    assert raised.value.problem.startswith(problem)
    assert str(raised.value) == f"{DAMAGED}: {raised.value.problem} {V.FIX}"
    assert isinstance(raised.value, MidEpochResumeError)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (
            lambda e: e["workers"].pop(),
            "`ranks[0].workers[0].workers`: expected a list of 2 items, one per worker (num_workers is 2), found a"
            " list of 1 item.",
        ),
        (lambda e: e.update(num_workers=0), "`ranks[0].workers[0].num_workers`: expected an int >= 1, found an int"),
        (
            lambda e: e.update(next_worker=2),
            "`ranks[0].workers[0].next_worker`: expected a worker id from 0 to 1 (num_workers is 2), found an int (2).",
        ),
        (
            lambda e: e.update(after_pass=e["workers"][:1]),
            "`ranks[0].workers[0].after_pass`: expected a list of 2 items, one per worker (num_workers is 2)",
        ),
        (
            lambda e: e["workers"][1]["state"]["global"].update(torch=e["workers"][1]["state"]["global"]["torch"][:9]),
            "`ranks[0].workers[0].workers[1].state.global.torch`: expected a uint8 tensor of shape",
        ),
        (lambda e: e["workers"][0].pop("seed"), "`ranks[0].workers[0].workers[0].seed`: expected an int"),
    ],
)
def test_worker_damage_is_named(states, damage, problem):
    state = copy.deepcopy(states["workers"])
    damage(_rank_0(state)["workers"][0])
    with pytest.raises(V.DamagedStateError) as raised:
        V.checked(state)
    assert raised.value.problem.startswith(problem)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda r: r["dataset_generators"].append(None), "`ranks[0].dataset_generators`: expected a list of 1 item"),
        (
            lambda r: r["dataset_generators"][0]["dataset.generator"].update(kind="dice"),
            "`ranks[0].dataset_generators[0]['dataset.generator'].kind`: expected 'torch' or 'python'",
        ),
    ],
)
def test_dataset_generator_damage_is_named(states, damage, problem):
    state = copy.deepcopy(states["main_process"])
    damage(_rank_0(state))
    with pytest.raises(V.DamagedStateError) as raised:
        V.checked(state)
    assert raised.value.problem.startswith(problem), raised.value.problem


def test_more_worker_entries_than_loaders_is_damage(states):
    state = copy.deepcopy(states["workers"])
    _rank_0(state)["workers"].append(None)
    with pytest.raises(V.DamagedStateError, match=re.escape("`ranks[0].workers`: expected a list of at most 1 item")):
        V.checked(state)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda e: e.update(record=None), "`elastic.record`: expected the pass record a random order is rebuilt from"),
        (lambda e: e["record"].update(at_first_next=None), "`elastic.record.at_first_next`: expected the states of"),
        (lambda e: e.update(dataset_length=21), "`elastic.dataset_length`: expected the dataset length of the single"),
        (lambda e: e["current"].update(batch_size=0), "`elastic.current.batch_size`: expected an int >= 1, found an"),
        (lambda e: e["phases"][0].pop("consumed"), "`elastic.phases[0].consumed`: expected an int >= 0, found nothing"),
        (lambda e: e["spec"].update(kind="distributed"), "`elastic.spec.seed`: expected an int from -"),
    ],
)
def test_elastic_damage_is_named(states, damage, problem):
    state = copy.deepcopy(states["elastic"])
    damage(state["elastic"])
    with pytest.raises(V.DamagedStateError) as raised:
        V.checked(state)
    assert raised.value.problem.startswith(problem)


def test_unknown_keys_are_not_damage(states):
    """A later release may add facts (a sampler's settings, say) without a new state version."""
    state = copy.deepcopy(states["two_ranks"])
    state["loaders"][0].update(replacement=False, num_samples=20)
    state["ranks"][0]["passes"][0]["note"] = "anything"
    assert V.checked(state)["loaders"][0]["num_samples"] == 20


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["loaders"][0].update(global_order=None),  # an order that cannot be rebuilt: nothing to check
        lambda s: _rank_0(s)["passes"].__setitem__(0, None),  # no pass recorded for a loader
        lambda s: _rank_0(s)["passes"][0].update(at_first_next=None),  # written before the pass drew its order
        lambda s: s["ranks"].__setitem__(1, None),  # a rank whose states could not be gathered
        lambda s: s["ranks"].pop(),  # nor sent: the ranks could not exchange them (no process group)
        lambda s: _rank_0(s)["rng"]["python"].update(gauss_next=0.25),
        lambda s: _rank_0(s).update(grads=None),
        lambda s: s.pop("stopped"),  # written by 0.1.0
    ],
)
def test_states_any_release_writes_are_intact(states, change):
    state = copy.deepcopy(states["two_ranks"])
    change(state)
    V.checked(state)


def test_an_empty_state_records_nothing_but_extra_position_keys_need_all_of_them():
    assert not S.records_position(V.checked(S.empty_state()))
    with pytest.raises(V.DamagedStateError, match=r"`package_version`: expected a str, found nothing"):
        V.checked({**S.empty_state(), "epoch": 1})  # one key of a position: the others were lost


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ([1, 2], "the state: expected a dict, found a list of 2 items."),
        ({"loaders": [], "ranks": []}, "`version`: expected an int >= 1, found nothing (the key is missing)."),
        ({"version": 0}, "`version`: expected an int >= 1, found an int (0)."),
    ],
)
def test_a_state_without_a_valid_version(state, problem):
    with pytest.raises(V.DamagedStateError) as raised:
        V.checked(state)
    assert raised.value.problem == problem


def test_a_newer_version_is_not_damage():
    with pytest.raises(MidEpochResumeError, match="Upgrade lightning-midepoch") as raised:
        V.checked({"version": S.STATE_VERSION + 1})
    assert not isinstance(raised.value, V.DamagedStateError)


def test_gradients_must_fit_the_parameters(states):
    state = states["two_ranks"]
    shapes = {name: tuple(grad.shape) for name, grad in state["ranks"][0]["grads"].items()}
    V.check_grads(state, shapes)
    wrong_shape = r"`ranks\[0\].grads\['net.0.bias'\]`: expected a tensor of shape \(8,\)"
    with pytest.raises(V.DamagedStateError, match=wrong_shape):
        V.check_grads(state, {**shapes, "net.0.bias": (8,)})
    del shapes["net.2.bias"]
    with pytest.raises(V.DamagedStateError, match=r"`ranks\[0\].grads\['net.2.bias'\]`: expected the gradient of one"):
        V.check_grads(state, shapes)


def test_describe():
    assert V.describe(None) == "None"
    assert V.describe(2.5) == "a float (2.5)"
    assert V.describe("x" * 50) == f"a str ('{'x' * 37}...')"
    assert V.describe((1,)) == "a tuple of 1 item"
    assert V.describe(object()) == "an object of type object"


# ---------------------------------------------------------------------------------------------- end to end
def edited_copy(source: Path, directory: Path, damage: Callable[[dict[str, Any]], Any]) -> Path:
    """A copy of a checkpoint file with its MidEpochResume state damaged (the original stays as written)."""
    checkpoint = load(source)
    damage(checkpoint["callbacks"][STATE_KEY])
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"edited-{source.name}"
    torch.save(checkpoint, path)
    return path


#: The damage the issue found resumed without a clear error, and what the error names.
PROBES = {
    "missing_key": (lambda s: s.pop("fetched"), "`fetched`"),
    "loaders_as_a_str": (lambda s: s.update(loaders="abcd"), "`loaders`"),
    "rng_of_another_size": (
        lambda s: _rank_0(s)["rng"].update(torch=_rank_0(s)["rng"]["torch"][:-8]),
        "`ranks[0].rng.torch`",
    ),
    "no_ranks": (lambda s: s.update(ranks=[]), "`ranks`"),
    "malformed_pass_record": (lambda s: _rank_0(s)["passes"][0].update(index=[0]), "`ranks[0].passes[0].index`"),
    "gradient_of_another_shape": (
        lambda s: _rank_0(s)["grads"].update({"net.2.weight": torch.zeros(16, 1)}),
        "`ranks[0].grads['net.2.weight']`",
    ),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_resuming_a_damaged_checkpoint_raises_naming_the_field(written, tmp_path, probe):
    damage, field = PROBES[probe]
    original = written["two_loaders"].read_bytes()
    path = edited_copy(written["two_loaders"], tmp_path, damage)
    with pytest.raises(MidEpochResumeError, match=re.escape(f"{DAMAGED}: {field}: expected")) as raised:
        run(TWO_LOADERS, tmp_path / "resumed", ckpt_path=path, seed=2)
    assert 'on_mismatch="restart_epoch"' in str(raised.value)
    assert written["two_loaders"].read_bytes() == original


def test_restart_epoch_warns_and_resumes_as_without_the_state(written, tmp_path):
    damaged = edited_copy(written["two_loaders"], tmp_path / "damaged", PROBES["loaders_as_a_str"][0])
    checkpoint = load(written["two_loaders"])
    del checkpoint["callbacks"][STATE_KEY]
    stripped = tmp_path / "stripped.ckpt"
    torch.save(checkpoint, stripped)
    runs = {}
    for name, path in (("damaged", damaged), ("stripped", stripped)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            runs[name] = run(
                TWO_LOADERS,
                tmp_path / name,
                callback=False,
                ckpt_path=path,
                extra_callbacks=[MidEpochResume(on_mismatch="restart_epoch")],
            )
        runs[name].warnings = [str(warning.message) for warning in caught]  # type: ignore[attr-defined]
    damaged_run, stripped_run = runs["damaged"], runs["stripped"]
    (warning,) = [message for message in damaged_run.warnings if "MidEpochResume" in message]
    assert warning.startswith(f"{DAMAGED}: `loaders`: expected a list")
    assert "on_mismatch='restart_epoch'" in warning
    assert any("has no MidEpochResume state" in message for message in stripped_run.warnings)
    # Lightning's own state restored, the rest as from the checkpoint without the callback's state
    assert damaged_run.seen == stripped_run.seen
    assert damaged_run.seen[0][:2] == (1, 4)
    assert damaged_run.trainer.global_step == stripped_run.trainer.global_step
    for ours, theirs in zip(damaged_run.model.parameters(), stripped_run.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_inspect_reports_the_damage(written, tmp_path, capsys):
    path = edited_copy(written["two_loaders"], tmp_path, PROBES["malformed_pass_record"][0])
    code = main(["inspect", str(path)])
    out, err = capsys.readouterr()
    assert (code, err) == (2, "")
    assert f"why: {DAMAGED}: `ranks[0].passes[0].index`: expected an int >= 0, found a list of 1 item." in out
    assert 'opt-out: Resume from an earlier checkpoint, use MidEpochResume(on_mismatch="restart_epoch")' in out
