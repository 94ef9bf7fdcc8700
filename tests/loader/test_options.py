"""The loader's options, written once (``LoaderOptions``) and checked once; the signature the
entry points show is derived from them; the loader's public input protocol."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from feedline.errors import ConfigurationError
from feedline.loader import Loader, LoaderOptions
from feedline.loader.checks import checked_int
from feedline.loader.options import OPTION_NAMES, loader_options, options_signature, ranks
from feedline.store.shard_source import BatchStream, ShardSource, SupportsShardSource


class Held:
    """Not a Dataset: any object with a ``shard_source()`` method is read."""

    def __init__(self, n: int) -> None:
        self.table = pa.table({"id": np.arange(n), "x": np.arange(n) * 2.0})
        self.asked: list[Sequence[str] | None] = []

    def shard_source(self, columns: Sequence[str] | None = None) -> ShardSource | BatchStream:
        self.asked.append(columns)
        table = self.table if columns is None else self.table.select(list(columns))
        return BatchStream.from_table(table)


def ids(loader: Loader) -> list[list[int]]:
    return [np.asarray(b["id"]).tolist() for b in loader]


def test_the_signature_shown_is_the_options_in_order_with_their_defaults() -> None:
    shown = list(inspect.signature(Loader).parameters.values())
    assert shown[0].name == "dataset"
    fields = {f.name: f for f in dataclasses.fields(LoaderOptions)}
    assert [p.name for p in shown[1:]] == list(OPTION_NAMES) == list(fields)
    for p in shown[1:]:
        assert p.default == fields[p.name].default and p.annotation == fields[p.name].type
    kinds = [p.kind for p in shown[1:]]
    assert (
        kinds
        == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 14 + [inspect.Parameter.KEYWORD_ONLY] * 20
    )
    assert inspect.signature(Loader.__init__).return_annotation == "None"


def test_options_pass_by_name_or_position_as_the_signature_says() -> None:
    held = Held(10)
    by_name = Loader(held, batch_size=4, shuffle=False, format="numpy")
    by_position = Loader(held, 4, False, format="numpy")
    assert ids(by_name) == ids(by_position) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert Loader(dataset=held, batch_size=4, format="numpy").options.batch_size == 4
    assert held.asked == [None, None]  # read when first iterated: the third never was


def test_a_wrong_name_is_refused_naming_the_closest_option() -> None:
    with pytest.raises(TypeError, match=r"unknown option 'batchsize'.*did you mean 'batch_size'"):
        Loader(Held(4), batchsize=2)
    with pytest.raises(TypeError, match=r"unknown option 'zzz'.*batch_size, shuffle"):
        loader_options([], {"zzz": 1})
    with pytest.raises(TypeError, match=r"at most 14 options by position.*by name"):
        Loader(Held(4), *([None] * 15))
    with pytest.raises(TypeError, match="multiple values"):
        Loader(Held(4), 2, batch_size=2)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"batch_size": 0}, "Loader: batch_size must be an int >= 1, got 0. Fix: pass batch_size"),
        ({"batch_size": 2.0}, "batch_size must be an int >= 1, got 2.0"),
        ({"batch_size": True}, "batch_size must be an int >= 1, got True"),
        ({"seed": -1}, "seed must be an int >= 0"),
        ({"prefetch": -1}, "prefetch must be an int >= 0"),
        ({"shuffle_window": 0}, "shuffle_window must be an int >= 1"),
        ({"rank": 2, "world_size": 2}, "rank=2 is out of range for world_size=2"),
        ({"format": "jax"}, "format='jax'"),
        ({"cache": "disk"}, "cache='disk'"),
        ({"memory_budget": "lots"}, "size"),
        ({"cache_dir": ""}, "cache_dir='' names no folder"),
        ({"transform": 3}, "transform=3 is not callable"),
        ({"num_workers": -1}, "num_workers=-1 must be an int >= 0"),
        ({"worker_type": "fiber"}, "worker_type='fiber'"),
        ({"device": "cuda", "format": "numpy"}, "device='cuda' needs format='torch'"),
        ({"columns": ["x"], "windows": object()}, "windows= takes a fl.Windows"),
    ],
)
def test_each_option_is_checked_when_the_options_are_built(options: dict, says: str) -> None:
    with pytest.raises(ConfigurationError, match="Fix:") as info:
        LoaderOptions(**options)
    assert says in str(info.value)


def test_the_options_are_kept_normalized_and_checking_them_again_changes_nothing() -> None:
    options = LoaderOptions(np.int64(8), 1, seed=np.int64(3), columns="x", memory_budget="1MB")
    assert (options.batch_size, options.shuffle, options.seed) == (8, True, 3)
    assert type(options.batch_size) is int and options.columns == ["x"]
    assert (options.memory_budget, options.cache_limit) == (10**6, 20 * 10**9)
    assert dataclasses.replace(options) == options
    assert dataclasses.replace(options, prefetch=0).prefetch == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_size = 3  # type: ignore[misc]


def test_rank_and_world_size_default_to_one_process() -> None:
    assert ranks(LoaderOptions()) == (0, 1)
    assert ranks(LoaderOptions(rank=2, world_size=3)) == (2, 3)
    with pytest.raises(ConfigurationError, match="rank=1 is out of range for world_size=1"):
        ranks(LoaderOptions(rank=1))  # the world size of a process alone


def test_the_loader_resolves_what_the_options_leave_open() -> None:
    training = Loader(Held(10), batch_size=3, format="numpy")
    assert training.drop_last is True and training.seed == 0 and training.options.seed is None
    evaluation = Loader(Held(10), batch_size=3, shuffle=False, format="numpy")
    assert evaluation.drop_last is False and len(evaluation) == 4
    padded = Loader(Held(10), batch_size=3, shuffle=False, return_padding_mask=True, format="numpy")
    assert padded.pad_last is True and ids(padded)[-1] == [9, 0, 1]
    transformed = Loader(Held(4), batch_size=2, transform=lambda s, rng: s, format="numpy")
    assert transformed.strings == "list" and transformed.options.strings == "raise"
    assert Loader(Held(4), cache_dir=False).cache_dir is None


def test_options_signature_shows_the_options_on_a_method_that_hands_them_on() -> None:
    class Source(Held):
        @options_signature
        def loader(self, *args: Any, **options: Any) -> Loader:
            return Loader(self, *args, **options)

    shown = inspect.signature(Source.loader)
    assert list(shown.parameters) == ["self", *OPTION_NAMES]
    assert shown.return_annotation == "Loader"
    assert ids(Source(5).loader(2, False, format="numpy")) == [[0, 1], [2, 3], [4]]
    with pytest.raises(TypeError, match="did you mean 'shuffle'"):
        Source(5).loader(shufle=False)
    with pytest.raises(TypeError, match=r"must take \*args and \*\*options"):

        @options_signature
        def explicit(self, batch_size: int = 256) -> None: ...


def test_the_loader_reads_any_object_with_a_shard_source_method() -> None:
    held = Held(6)
    assert isinstance(held, SupportsShardSource) and not isinstance([1], SupportsShardSource)
    loader = Loader(held, batch_size=2, seed=1, format="numpy", columns=["id"])
    assert sorted(i for b in ids(loader) for i in b) == list(range(6))
    assert set(next(iter(loader))) == {"id"}
    with pytest.raises(ConfigurationError, match=r"cannot read list objects.*shard_source\(\)"):
        len(Loader([1, 2, 3], batch_size=2))


def test_one_int_check_serves_every_kind_of_count() -> None:
    assert checked_int(np.int64(5), 1, fail=ValueError) == 5
    assert checked_int(3, 0, 3, fail=ValueError) == 3
    for bad in (4, -1, True, 1.0, np.arange(2), "1", None):
        with pytest.raises(ValueError, match=r"^an int in \[0, 3\]$"):
            checked_int(bad, 0, 3, fail=ValueError)
