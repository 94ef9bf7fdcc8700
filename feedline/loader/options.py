"""The loader's options: one frozen, validated :class:`LoaderOptions`.

Design
------
The 34 options are written once, as the fields of :class:`LoaderOptions`: name, type, default,
kind (the first 14 may be passed by position, as before) and meaning (its docstring). They are
checked once, when it is built (one check per kind of value: counts with
:func:`~feedline.loader.checks.checked_int`, names from a list with one shared message,
sizes with :func:`~feedline.arrow.sizes.parse_bytes`), and kept normalized (a size in bytes, a
single column name as a list), so nothing downstream checks or parses an option again.

The entry points take them through, never by listing them:

- ``Loader(dataset, *args, **options)`` builds ``LoaderOptions(*args, **options)`` with
  :func:`loader_options` (a wrong name raises ``TypeError`` naming the closest option);
- ``Dataset.loader(*args, **options)`` is ``Loader(self, *args, **options)``.

Both carry the ``__signature__`` that :func:`options_signature` derives from the dataclass's
own signature, so ``inspect.signature``, ``help()`` and IDE call tips at runtime list every
option by name, kind, annotation and default, exactly as the explicit parameter lists did,
and the two entry points cannot drift apart (there is nothing to copy). Static type checkers
do not read ``__signature__``: they see ``*args: Any, **options: Any``, the price of one list
instead of three; the options' types are still checked, here, at runtime.

What is checked here is what an option means on its own or beside another option (``device``
needs ``format="torch"``, ``windows`` picks its own columns). The options the data path
applies to the schema (``columns``, ``stack``, ``dtype``, ``shapes``, ``ragged``,
``strings``) are checked where they are applied, once, when the loader first loads; what
depends on this process is resolved when the :class:`~feedline.loader.Loader` is built
(:func:`ranks` from ``torch.distributed``, pinning without CUDA, the default cache folder).

Examples
--------
>>> options = LoaderOptions(batch_size=32, memory_budget="1GB", columns="x")
>>> options.batch_size, options.memory_budget, options.columns, options.shuffle
(32, 1000000000, ['x'], True)
>>> LoaderOptions(batch_size=0)
Traceback (most recent call last):
...
feedline.errors.ConfigurationError: Loader: batch_size must be an int >= 1, got 0. Fix: ...
"""

from __future__ import annotations

import difflib
import inspect
import operator
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any, TypeVar

from feedline.arrow.sizes import parse_bytes
from feedline.errors import ConfigurationError
from feedline.loader.adapters.formats import FORMATS
from feedline.loader.adapters.torch import distributed_defaults
from feedline.loader.checks import MAX_COUNT, checked_int
from feedline.loader.data.windows import Windows
from feedline.loader.nodes.worker_pools import check_timeout, check_workers
from feedline.loader.order.state import MAX_WORLD_SIZE
from feedline.loader.packing.spec import Packing

__all__ = [
    "CACHES",
    "OPTION_NAMES",
    "LoaderOptions",
    "check_epoch",
    "check_prefetch",
    "loader_options",
    "options_signature",
    "ranks",
    "ranks_per_node",
]

#: the values of ``cache=``
CACHES = ("auto", "memory", "node", "staged", "none")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class LoaderOptions:
    """How a :class:`~feedline.loader.Loader` reads, orders and delivers batches.

    ``Loader(dataset, **options)`` and ``Dataset.loader(**options)`` take exactly these
    (the first 14 also by position). Every value is checked when the options are built;
    sizes are kept in bytes and a single column name as a list.

    Parameters
    ----------
    batch_size:
        Samples per batch on each rank.
    shuffle, seed:
        Shuffle every epoch (the training default); the order depends only on ``(seed,
        epoch)``. ``seed=None`` means 0, or the checkpoint's seed after
        :meth:`~feedline.loader.Loader.load_state_dict`; an explicit seed must match the
        checkpoint's.
    rank, world_size:
        This process's rank and the number of processes; ranks get disjoint, equally many
        batches that together cover the epoch. ``None`` (default): ``torch.distributed``'s
        rank and world size when it is initialized, else 0 and 1.
    drop_last:
        ``True`` drops the remainder (< ``world_size * batch_size`` samples; when that is the
        whole epoch, a warning says so); ``False`` keeps every sample: each rank's last batch
        is short (the last step's samples fill the ranks' last batches in rank order, so a
        later rank's may be shorter) and every rank still yields ``len(loader)`` batches
        (equal steps for DDP's all-reduce). No batch is ever empty: a rank with no sample left
        for its last batch gets one repeated sample (the epoch's first it would pad with; see
        ``pad_last`` to mark repeats). ``None`` (default): ``True`` when
        shuffling (training: a different remainder each epoch), ``False`` with
        ``shuffle=False`` (evaluation: every sample, once). Evaluate with ``shuffle=False``.
    columns:
        Columns to load (default all). String columns need ``strings="list"`` (or a
        ``transform``).
    cache:
        ``"memory"`` loads the columns into NumPy arrays (exact permutation), ``"none"``
        streams row groups (two-level shuffle), ``"auto"`` caches when the estimate from the
        schema and row count fits ``memory_budget``. ``"node"``: one cache per machine, a
        file under ``<cache_dir>/node`` (default ``~/.cache/feedline/node``) that the first
        loader process fills once (verified as it reads) and every loader process of the node
        memory-maps read-only: 8 ranks hold one copy (the page cache's), a restarted job starts
        at once, the permutation stays exact, and data larger than RAM is paged by the OS
        (random reads from disk: slower than a memory cache when it does not fit). Works
        across separately started processes (torchrun, ``torch.multiprocessing``, Ray Train);
        numbers and tensors only; needs a written dataset. ``"auto"`` picks ``"node"`` when
        ``world_size > 1`` and those hold, for an estimate of 64 MiB up to ``memory_budget``.
        See :mod:`feedline.loader.data.node_cache`. ``"staged"``: the exact order of
        ``"memory"`` (same batches, same ``state_dict()``) for data over the memory: each
        epoch is staged, one epoch ahead in a background thread, by a two-pass external
        shuffle within ``memory_budget``: the rows go to per-rank bucket files (under
        ``stage_dir``, by default ``<cache_dir>/staged/exchange``), each bucket is read back
        sequentially and put in the rank's read order in memory as the rank reaches it
        (two buckets held, a sixteenth of the budget each, an eighth with one rank); each
        node reads only its share of the row groups (see ``ranks_per_node``, ``stage_dir`` and
        :mod:`feedline.loader.data.staging.stager`). ``"auto"`` picks it, when shuffling,
        for numbers and tensors of a written dataset over ``memory_budget``.
    prefetch:
        Batches a background thread keeps ready (at least). It gathers them in groups with one
        take per column (the batches are views of it): ``prefetch`` batches, or as many as make
        about 1 MiB when cached batches are small, at most 64. 0 gathers in the calling thread,
        one batch at a time. ``"auto"``: start at 2 and deepen the queue while the training
        loop waits for batches the pipeline makes fast enough on average (uneven batches),
        within half of what ``memory_budget`` leaves beside the cache (see
        :mod:`feedline.loader.profiling.autotune`).
    format:
        ``"torch"`` (dict of ``torch.Tensor`` via ``torch.from_numpy``), ``"numpy"`` or ``"tf"``.
        Dtypes: bool → ``torch.bool``; ints and floats kept; uint16/uint32 widened to
        int32/int64 for torch, uint64 refused (see :mod:`feedline.loader.data.columns`).
    pin_memory:
        Gather into page-locked tensors (``format="torch"``; ignored with a warning when no
        CUDA device is present).
    shuffle_window:
        Row groups per pool of the two-level shuffle. Default: exact permutation when cached,
        as many groups as fit a third of ``memory_budget`` when streaming; a larger one is
        lowered to that (an INFO line says so), so the pools stay within the budget.
    memory_budget:
        Bytes (or ``"2GB"``) the loader may hold. Default ``"auto"``: 2 GB, or a quarter of
        the memory this process may still use when that is less (its memory cgroup's limit
        less its usage, cgroup v1 or v2: a container's limit counts; see
        :mod:`feedline.loader.data.memory_budget`). ``cache="auto"`` caches the columns when
        their estimate fits it, else streams with the two-level shuffle (an INFO log line and
        ``stats()["shuffle_mode"]`` say so; ``cache="node"`` or a larger budget keep the exact
        shuffle). A batch, and a streamed row group, must fit it (checked before anything is
        allocated: a ConfigurationError names the column and the sizes).
    windows:
        A :class:`~feedline.loader.data.windows.Windows` to yield time-series windows instead
        of rows.
    strings:
        ``"raise"`` (default) refuses string columns; ``"list"`` yields them as Python lists.
    return_padding_mask:
        Add a ``"_padded"`` boolean key, True where a sample repeats one to pad the epoch.
    track:
        ``True`` logs :meth:`~feedline.loader.Loader.metrics` (``loader/samples_per_s``,
        ``loader/data_wait_fraction``, ``loader/batches``, ``loader/samples``,
        ``loader/seconds``) to the MLflow run active when the loader is created, with
        ``step=epoch``, each time an epoch completes; a run id logs to that run instead.
        Needs ``feedline[mlflow]``; see :mod:`feedline.tracking`.
    cache_dir, cache_limit:
        Remote shards (any non-local URL, e.g. ``s3://``) are downloaded ahead of use into
        the shard cache folder ``cache_dir`` (default ``~/.cache/feedline/shards``; shared
        safely by the processes of a node and across datasets: files are named by checksum),
        checked against the manifest's size and sha256 (once per loader), and read from
        there; ``cache_limit`` (bytes or ``"20GB"``) caps the folder by evicting the least
        recently used shards that no reader holds. ``cache_dir=False`` reads remote shards
        directly. Local datasets are never copied. See :mod:`feedline.loader.data.shard_cache`.
        ``cache="node"`` files go in ``<cache_dir>/node`` (``~/.cache/feedline/node`` when
        ``cache_dir`` is the default or ``False``); point it at a local disk with room.
    stack:
        ``{"features": ["a", "b", ...]}``: one ``(batch, F)`` array per key of those numeric
        columns side by side (``F`` = their total width; a tensor column adds its element
        count), held in their common dtype; the columns leave the batch dict unless
        ``columns=`` names them (then they come as views of the stack). Scalar columns of one
        dtype are held row-major in one block either way: a batch is one take per block.
    dtype:
        Convert as the cache fills: one dtype for every column of its family (``np.float32``
        turns float64 features into float32 and keeps an int64 label), or
        ``{column or stack: dtype}``.
    pad_last:
        With ``drop_last=False``: fill the last batches to ``batch_size`` by repeating
        samples from the start of the epoch instead (full batches on every rank; the repeats
        are marked in ``"_padded"`` with ``return_padding_mask=True``, which implies it).
    transform, batched:
        ``fn(sample: dict, rng: np.random.Generator) -> dict`` applied to every sample, or
        with ``batched=True`` ``fn(batch: dict, rngs) -> dict`` to every batch
        (:class:`~feedline.loader.nodes.Map`); ``rng`` is seeded by ``(seed, epoch, row
        index)`` (:func:`~feedline.loader.order.rng.sample_rng`): augmentation differs per
        epoch, repeats on a re-run and on an exact resume, whatever the workers. Results are
        stacked per batch (arrays of one shape, numbers; other values as lists). String and
        binary columns reach it as Python values (``strings="list"`` implied). A
        :class:`~feedline.preprocess.vision.augment.Skipped` result (e.g. an undecodable image
        under ``on_error="skip"``, see :class:`~feedline.loader.transforms.ImageTransform`)
        drops that sample: its batch is shorter (never refilled, so resume stays exact and
        every rank keeps ``len(loader)`` batches), and it is counted in
        :meth:`~feedline.loader.Loader.stats` and :meth:`~feedline.loader.Loader.metrics`.
    num_workers, worker_type:
        Run ``transform`` in ``num_workers`` ``"thread"`` workers (GIL-releasing work:
        Pillow decode, NumPy, tokenizers) or ``"process"`` workers (Python-heavy work; the
        transform must be importable, outputs come back through shared memory); 0 runs it
        in the prefetch thread. Workers start once per loader and stop on
        :meth:`~feedline.loader.Loader.close`, garbage collection or exit; batches come out
        in order regardless of worker timing. ``num_workers="auto"`` starts one worker and
        adds one at a time while the training loop waits, the workers are busy, a CPU is
        free (``os.sched_getaffinity``, the cgroup's ``cpu.max``) and the last one added
        raised throughput by more than 10% (else removes it); the batches are the same as
        with any fixed count (:mod:`feedline.loader.profiling.autotune`,
        ``stats()["autotune"]``).
    timeout:
        Seconds one call of ``transform`` (one sample; one batch with ``batched=True``) may
        run in a worker; a call running longer raises
        :class:`~feedline.errors.UserFunctionError` naming its sample's row index (or the
        batch's) instead of blocking the loader forever. A stuck worker process is killed
        (the workers restart on the next iteration); a stuck thread cannot be stopped: it is
        abandoned (a daemon thread that keeps running, with its CPU and memory, until the
        call returns; its result is dropped) and a new thread takes its place. ``None``
        (default): no limit. Needs ``num_workers >= 1``.
    device:
        Move each batch to this torch device (``"cuda"``, ``"cuda:1"``) with
        ``non_blocking=True`` on a side CUDA stream, one batch ahead (pair with
        ``pin_memory=True``); ``None`` or a CPU device leaves batches where they are.
    shapes, ragged, pad_value:
        List columns (``list`` / ``large_list`` / ``fixed_size_list`` of numbers, nested or
        not, as Spark's ``ArrayType`` and pyarrow write arrays) load as tensors:
        ``shapes={"image": (3, 64, 64)}`` gives a column's per-sample shape (positive ints),
        else it is that of the first row. Every row is checked as it loads; a row of another length
        or a null row raises :class:`~feedline.errors.DataError` naming it, unless
        ``ragged`` (one policy or ``{column: policy}``) is ``"pad"`` (short and null rows
        filled with ``pad_value``), ``"truncate"`` (long rows cut) or ``"pad_or_truncate"``
        (both; these need the shape in ``shapes``). See :mod:`feedline.arrow.list_tensors`.
        ``"list"`` keeps a 1-D list of integers as it is: one array per row, a list of them
        per batch (token documents, as packing reads them).
    stage_dir:
        ``cache="staged"`` on several nodes: a folder every node reads and writes (a shared
        file system) through which the nodes exchange the rows each one read for the others
        (see :mod:`feedline.loader.data.staging.exchange`). ``None``: one node, a local folder
        under ``<cache_dir>/staged``.
    ranks_per_node:
        Training processes per machine: rank ``r`` runs on node ``r // ranks_per_node``
        (torchrun's numbering). ``None``: torchrun's ``LOCAL_WORLD_SIZE`` when set, else every
        rank on one node. Used by ``cache="staged"``.
    pack:
        A :class:`~feedline.loader.packing.spec.Packing` (``fl.Packing(seq_len=2048)``): the
        loader packs the documents of its token column into rows of exactly ``seq_len``
        tokens and yields batches of ``batch_size`` rows (``input_ids``, ``labels``,
        ``position_ids``, boundaries), resumable exactly, also on another ``world_size``
        (:mod:`feedline.loader.packing`). The number of batches depends on the documents:
        ``len(loader)`` is not known ahead.

    Examples
    --------
    >>> LoaderOptions(64, shuffle=False).drop_last is None  # the Loader resolves it
    True
    >>> LoaderOptions(format="jax")
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Loader: format='jax' / cache='auto'; format is one of ...
    """

    batch_size: int = 256
    shuffle: bool = True
    seed: int | None = None
    rank: int | None = None
    world_size: int | None = None
    drop_last: bool | None = None
    columns: Sequence[str] | None = None
    cache: str = "auto"
    prefetch: int | str = 2
    format: str = "torch"
    pin_memory: bool = False
    shuffle_window: int | None = None
    memory_budget: int | str = "auto"
    windows: Windows | None = None
    _: KW_ONLY
    strings: str = "raise"
    return_padding_mask: bool = False
    track: bool | str = False
    cache_dir: str | os.PathLike[str] | bool | None = None
    cache_limit: int | str = "20GB"
    stack: Mapping[str, Sequence[str]] | None = None
    dtype: Any = None
    pad_last: bool = False
    transform: Callable[..., Any] | None = None
    batched: bool = False
    num_workers: int | str = 0
    worker_type: str = "thread"
    device: Any = None
    shapes: Mapping[str, Sequence[int]] | None = None
    ragged: str | Mapping[str, str] = "raise"
    pad_value: float = 0
    timeout: float | None = None
    pack: Packing | None = None
    stage_dir: str | os.PathLike[str] | None = None
    ranks_per_node: int | None = None

    def __post_init__(self) -> None:
        keep = object.__setattr__  # frozen: the checked, normalized values replace the given
        keep(self, "batch_size", _count("batch_size", self.batch_size, 1))
        if self.seed is not None:
            keep(self, "seed", _count("seed", self.seed, 0, None))
        if self.world_size is not None:
            keep(self, "world_size", _count("world_size", self.world_size, 1, MAX_WORLD_SIZE))
        if self.rank is not None:
            keep(self, "rank", _count("rank", self.rank, 0, MAX_WORLD_SIZE - 1))
        keep(self, "prefetch", check_prefetch(self.prefetch))
        if self.rank is not None and self.world_size is not None:
            _check_rank(self.rank, self.world_size)
        if self.format not in FORMATS or self.cache not in CACHES:
            raise ConfigurationError(
                f"Loader: format={self.format!r} / cache={self.cache!r}; format is one of "
                f"{FORMATS}, cache one of {CACHES}. Fix: pass one of those values."
            )
        if self.ranks_per_node is not None:
            keep(self, "ranks_per_node", _count("ranks_per_node", self.ranks_per_node, 1,
                                                MAX_WORLD_SIZE))  # fmt: skip
        if self.shuffle_window is not None:
            keep(self, "shuffle_window", _count("shuffle_window", self.shuffle_window, 1))
        windows, columns = self.windows, self.columns
        if windows is not None and (columns is not None or not isinstance(windows, Windows)):
            raise ConfigurationError(
                "Loader: windows= takes a fl.Windows(...) and picks its own columns "
                "(features=/targets=). Fix: drop columns= or pass a Windows."
            )
        if isinstance(columns, str):
            keep(self, "columns", [columns])
        if self.memory_budget != "auto":  # "auto" depends on this process: the Loader's
            keep(self, "memory_budget", parse_bytes(self.memory_budget))
        keep(self, "cache_limit", parse_bytes(self.cache_limit))
        cache_dir = self.cache_dir
        if not isinstance(cache_dir, bool) and cache_dir is not None and not os.fspath(cache_dir):
            raise ConfigurationError(
                "Loader: cache_dir='' names no folder. Fix: pass a folder for the shard cache, "
                "None for the default (~/.cache/feedline/shards) or False to read remote "
                "shards directly."
            )
        if self.transform is not None and not callable(self.transform):
            raise ConfigurationError(
                f"Loader: transform={self.transform!r} is not callable. Fix: pass fn(sample, "
                "rng) -> dict (or fn(batch, rngs) -> dict with batched=True)."
            )
        keep(self, "num_workers", check_workers(self.num_workers, self.worker_type))
        workers = 1 if self.num_workers == "auto" else int(self.num_workers)  # auto: 1 or more
        keep(self, "timeout", check_timeout(self.timeout, workers))
        if self.device is not None and self.format != "torch":
            raise ConfigurationError(
                f"Loader: device={self.device!r} needs format='torch' (got {self.format!r}). "
                "Fix: use format='torch', or move batches yourself."
            )
        if self.pack is not None and not isinstance(self.pack, Packing):
            raise ConfigurationError(
                f"Loader: pack={self.pack!r} is not a fl.Packing. Fix: pass "
                "pack=fl.Packing(seq_len=2048, column='input_ids')."
            )
        for flag in ("shuffle", "pin_memory", "return_padding_mask", "pad_last", "batched"):
            keep(self, flag, bool(getattr(self, flag)))
        if self.drop_last is not None:
            keep(self, "drop_last", bool(self.drop_last))


#: the options' names, in signature order
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(LoaderOptions))
#: the options as parameters (name, kind, annotation, default), in signature order
_PARAMETERS = tuple(inspect.signature(LoaderOptions).parameters.values())
#: how many options may be passed by position
_POSITIONAL = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in _PARAMETERS)


def _count(name: str, value: Any, low: int, high: int | None = MAX_COUNT) -> int:
    """A count option as an int in ``[low, high]`` (:func:`~feedline.loader.checks.checked_int`;
    ``high`` defaults to :data:`~feedline.loader.checks.MAX_COUNT`, ``None``: no bound)."""

    def fail(expected: str) -> ConfigurationError:
        try:
            big = high is not None and not isinstance(value, bool) and operator.index(value) > high
        except TypeError:  # not an integer at all
            big = False
        wanted, fix = (
            (f"an int <= {high}", f"{name}={high} or less") if big
            else (f"an int >= {low}", f"{name}={low} or more")
        )  # fmt: skip
        return ConfigurationError(
            f"Loader: {name} must be {wanted}, got {value!r}. Fix: pass {fix}."
        )

    return checked_int(value, low, high, fail=fail)


def check_prefetch(prefetch: Any) -> int | str:
    """``prefetch``: an int >= 0 (batches kept ready) or ``"auto"`` (tuned while the loader
    runs, :mod:`feedline.loader.profiling.autotune`), else a :class:`ConfigurationError`.

    Examples
    --------
    >>> check_prefetch(2), check_prefetch("auto")
    (2, 'auto')
    """
    if isinstance(prefetch, str):
        if prefetch == "auto":
            return "auto"
        raise ConfigurationError(
            f"Loader: prefetch must be an int >= 0 or 'auto', got {prefetch!r}. Fix: pass "
            "prefetch=2 (batches kept ready), 0 (none) or 'auto' (tuned as it runs)."
        )
    return _count("prefetch", prefetch, 0)


def _check_rank(rank: int, world_size: int) -> None:
    if rank >= world_size:
        raise ConfigurationError(
            f"Loader: rank={rank} is out of range for world_size={world_size}. Fix: pass "
            "torch.distributed.get_rank() and get_world_size()."
        )


def check_epoch(epoch: Any) -> int:
    """An epoch number (``Loader.set_epoch``) as an int in ``[0, 2**62)``, else
    ConfigurationError.

    Examples
    --------
    >>> check_epoch(3)
    3
    >>> check_epoch(10**20)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Loader: epoch must be an int <= 4611686018427387903, ...
    """
    return _count("epoch", epoch, 0)


def loader_options(
    args: Sequence[Any], options: Mapping[str, Any], where: str = "Loader"
) -> LoaderOptions:
    """The :class:`LoaderOptions` of a call ``where(..., *args, **options)``, checked.

    A name that is not an option raises ``TypeError`` (as any unexpected keyword does)
    naming the closest option and listing them all; so does passing more options by
    position than the 14 that may be.

    Examples
    --------
    >>> loader_options([32], {"shuffle": False}).batch_size
    32
    >>> loader_options([], {"batchsize": 32})
    Traceback (most recent call last):
    ...
    TypeError: Loader() got an unknown option 'batchsize'. Fix: did you mean 'batch_size'? ...
    """
    unknown = [name for name in options if name not in OPTION_NAMES]
    if unknown:
        close = difflib.get_close_matches(unknown[0], OPTION_NAMES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TypeError(
            f"{where}() got an unknown option {unknown[0]!r}. Fix: {hint}The options (see "
            f"feedline.loader.options.LoaderOptions): {', '.join(OPTION_NAMES)}."
        )
    if len(args) > _POSITIONAL:
        names = ", ".join(OPTION_NAMES[:_POSITIONAL])
        raise TypeError(
            f"{where}() takes at most {_POSITIONAL} options by position ({names}), got "
            f"{len(args)}. Fix: pass the others by name."
        )
    return LoaderOptions(*args, **options)


def ranks(options: LoaderOptions) -> tuple[int, int]:
    """This process's rank and world size: the options', each ``None`` taken from
    ``torch.distributed`` (see :func:`~feedline.loader.adapters.torch.distributed_defaults`).

    Examples
    --------
    >>> ranks(LoaderOptions(rank=1, world_size=4)), ranks(LoaderOptions())
    ((1, 4), (0, 1))
    """
    rank, world_size = distributed_defaults(options.rank, options.world_size)
    if options.rank is None or options.world_size is None:  # else checked with the options
        _check_rank(rank, world_size)
    return rank, world_size


def ranks_per_node(options: LoaderOptions, world_size: int) -> int:
    """Ranks per node: the option's, else torchrun's ``LOCAL_WORLD_SIZE`` when it divides
    ``world_size``, else ``world_size`` (every rank on one node).

    Examples
    --------
    >>> ranks_per_node(LoaderOptions(ranks_per_node=2), 4)
    2
    """
    if options.ranks_per_node is not None:
        return options.ranks_per_node
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) >= 1 and world_size % int(local) == 0:
        return int(local)
    return world_size


def options_signature(function: F) -> F:
    """Show ``function(<its own parameters>, *args, **options)`` as taking every loader
    option by name, kind, annotation and default (its ``__signature__``).

    ``function`` must take ``*args`` and ``**options`` and hand them on to
    :func:`loader_options` (directly or through ``Loader``), so that the signature it shows
    is the one it has; its own positional parameters come first, its return annotation stays.

    Examples
    --------
    >>> @options_signature
    ... def loader(self, *args: Any, **options: Any) -> int:
    ...     return loader_options(args, options).batch_size
    >>> shown = inspect.signature(loader).parameters
    >>> list(shown)[:3], shown["batch_size"].default, len(shown) == 1 + len(OPTION_NAMES)
    (['self', 'batch_size', 'shuffle'], 256, True)
    >>> loader(None, 32, shuffle=False)
    32
    """
    signature = inspect.signature(function)
    kinds = {p.kind for p in signature.parameters.values()}
    if not {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds:
        raise TypeError(
            f"options_signature: {function.__qualname__} must take *args and **options (it "
            "hands them to the loader). Fix: def f(self, *args, **options)."
        )
    leading = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    own = [p for p in signature.parameters.values() if p.kind in leading]
    derived = signature.replace(parameters=[*own, *_PARAMETERS])
    function.__signature__ = derived  # type: ignore[attr-defined]
    return function
