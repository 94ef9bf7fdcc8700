"""Joins of Arrow tables already in memory, run by Arrow's own hash join (Acero).

The local engine runs relational operators in DuckDB (:mod:`feedline.engines.local.relational`),
which spills when the data outgrows ``relational_memory``. A join whose two inputs are Arrow
tables the process already holds (``fl.from_arrow``, at most a column selection) cannot
outgrow memory on its probe side, so when the right (build) side is small against
``relational_memory`` (a quarter at most) and so is the output of one match per left row
(Acero does not pause its inputs for a slow consumer: it may hold its whole output), it
runs in ``pyarrow.acero``'s hash join instead, streaming its output. Many matches per key
can make the output larger than that estimate; a consumer slower than the join then finds
it held in memory (DuckDB would have paused the join).

Why (bench/ops.py's join, 10M rows against a 1M-row table, on this shared 2-core machine,
best of 6-12 runs, all noisy): the join itself costs both engines about the same CPU (0.5
CPU-s in Acero's hash table, 0.58 in DuckDB's), but around it Acero needs no connection
(15 ms for DuckDB) and no conversion of its result to Arrow (0.15 CPU-s in DuckDB): 0.33-0.41
s against 0.44-0.49 s for the engine's DuckDB path; in one bench run, 0.374 s against 0.411
for DuckDB's own ``to_arrow_table`` and 0.450 for pandas' merge.

Only ``inner``, ``left``, ``semi`` and ``anti`` joins take this path (an ``outer`` join fills its
keys from either side: DuckDB does that), and only with key and column types whose Acero
semantics equal DuckDB's (no floating-point keys: DuckDB matches ``-0.0`` with ``0.0``; no
nested, dictionary, view or null columns, which Acero's join does not carry). Null keys never
match on either path. Row order is unspecified on both.

Examples
--------
>>> import pyarrow as pa
>>> from feedline.plan.relational import Relational
>>> join = Relational("join", (("on", ("k",)), ("how", "inner"), ("suffix", "_r")))
>>> left = pa.table({"k": [1, 2, None], "x": ["a", "b", "c"]})
>>> right = pa.table({"k": [2, None], "x": ["B", "N"]})
>>> reader = arrow_join(join, left, right, ["k", "x", "x_r"], memory=1 << 30, threads=True)
>>> reader.read_all().to_pydict()
{'k': [2], 'x': ['b'], 'x_r': ['B']}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from feedline.plan.relational import Relational

__all__ = ["BUILD_SHARE", "arrow_join", "arrow_joinable"]

#: the right (build) input may use at most this share of ``relational_memory``: Acero's hash
#: table over it takes a few times its size, and Acero does not spill
BUILD_SHARE = 4

#: the prefix of the right key columns' names in the join (no other column has it)
_KEY = "__feedline_key_"

#: feedline's join types Acero runs, by Acero's name
_HOWS = {"inner": "inner", "left": "left outer", "semi": "left semi", "anti": "left anti"}


def _key_type(kind: pa.DataType) -> bool:
    return (
        pa.types.is_integer(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
    )


def _column_type(kind: pa.DataType) -> bool:
    return (
        _key_type(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_float32(kind)
        or pa.types.is_float64(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_time(kind)
        or pa.types.is_duration(kind)
        or pa.types.is_fixed_size_binary(kind)
    )


def arrow_joinable(relational: Relational, left: pa.Table, right: pa.Table, memory: int) -> bool:
    """Whether :func:`arrow_join` runs this join of in-memory tables (see the module).

    Examples
    --------
    >>> import pyarrow as pa
    >>> from feedline.plan.relational import Relational
    >>> t = pa.table({"k": [1.0], "x": [1]})
    >>> def join(how):
    ...     return Relational("join", (("on", ("k",)), ("how", how), ("suffix", "_r")))
    >>> arrow_joinable(join("inner"), t, t, 1 << 30)  # a floating-point key
    False
    >>> t = t.cast(pa.schema([("k", pa.int64()), ("x", pa.int64())]))
    >>> arrow_joinable(join("inner"), t, t, 1 << 30), arrow_joinable(join("outer"), t, t, 1 << 30)
    (True, False)
    """
    on = relational.param("on")
    # the output when each left row matches at most once: Acero holds what its consumer has
    # not taken yet (it does not pause its inputs), so it must fit too
    payload = right.drop_columns([c for c in right.schema.names if c.startswith(_KEY)])
    per_row = payload.nbytes / max(1, payload.num_rows)
    return (
        relational.param("how") in _HOWS
        and right.nbytes * BUILD_SHARE <= memory
        and left.nbytes + left.num_rows * per_row <= memory
        and all(_key_type(left.schema.field(k).type) for k in on)
        and all(_column_type(f.type) for f in (*left.schema, *right.schema))
    )


def arrow_join(
    relational: Relational,
    left: pa.Table,
    right: pa.Table,
    names: Sequence[str],
    *,
    memory: int,
    threads: bool,
) -> pa.RecordBatchReader | None:
    """The join of ``left`` and ``right`` as a stream of batches with the output columns
    ``names`` (any of the join's output columns, in any order), or ``None`` when it is not
    :func:`arrow_joinable` (or asks for no column): DuckDB runs it then. ``threads``: run on
    Arrow's CPU thread pool."""
    on, how = list(relational.param("on")), relational.param("how")
    outputs = _right_outputs(relational, left.schema.names, right.schema.names)
    wanted = set(names)
    left_out = [c for c in left.schema.names if c in wanted]
    payload = [] if how in ("semi", "anti") else [c for c in outputs if outputs[c] in wanted]
    # only the columns the join reads, the right ones under their output names (the keys
    # under names no column has)
    left = left.select(list(dict.fromkeys([*on, *left_out])))
    right_keys = [f"{_KEY}{i}" for i in range(len(on))]
    right = right.select([*on, *payload]).rename_columns(
        [*right_keys, *(outputs[c] for c in payload)]
    )
    if not names or not arrow_joinable(relational, left, right, memory):
        return None
    import pyarrow.acero as acero

    right_out = [outputs[c] for c in payload]
    join = acero.Declaration(
        "hashjoin",
        acero.HashJoinNodeOptions(_HOWS[how], on, right_keys, left_out, right_out),
        inputs=[
            acero.Declaration("table_source", acero.TableSourceNodeOptions(left)),
            acero.Declaration("table_source", acero.TableSourceNodeOptions(right)),
        ],
    )
    produced = [*left_out, *right_out]
    if produced != list(names):
        join = acero.Declaration(
            "project",
            acero.ProjectNodeOptions([pc.field(n) for n in names], list(names)),
            inputs=[join],
        )
    return join.to_reader(use_threads=threads)


def _right_outputs(
    relational: Relational, left: Sequence[str], right: Sequence[str]
) -> dict[str, str]:
    """Each right non-key column's output name (``suffix`` added when the name is taken), as
    :func:`feedline.plan.relational_schema.output_schema` names them."""
    on, suffix = relational.param("on"), relational.param("suffix")
    taken, outputs = set(left), {}
    for name in right:
        if name in on:
            continue
        outputs[name] = name + suffix if name in taken else name
        taken.add(outputs[name])
    return outputs
