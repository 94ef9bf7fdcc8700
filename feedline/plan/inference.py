"""Batch inference: a model class built once per worker, called per batch.

``ds.map_batches(Model, batch_size=..., concurrency=..., device=...)`` runs ``Model`` over a
dataset on every engine:

- **local**: the operators before the model run in the read tasks (the thread pool); the
  model is a separate stage of ``concurrency`` worker threads (default 1) fed by a queue
  bounded in bytes, so reading, decoding and preprocessing overlap with the model. Batches
  reach the model at exactly ``batch_size`` rows, re-cut across read tasks (the last may be
  short). Each worker thread constructs ``Model`` once, when it starts; a worker starts
  when a batch is there for it, so ``min(concurrency, number of batches)`` models are built.
  With ``preserve_order=True`` (the default) the outputs come in input order.
- **spark**: the model runs in ``mapInArrow``; each Python worker process builds it once
  and keeps it (a registry in the worker keyed by class, constructor arguments and device)
  for the following tasks, partitions and jobs while Spark reuses the worker.
- **ray**: an actor pool of ``concurrency`` actors (default: autoscaling from 1 to the
  cluster's CPUs); each actor builds the model once when it starts.

Spark and Ray learn the output schema by running the model on 16 rows on the driver
(one more construction there) unless ``map_batches`` gets ``output_schema=``; pass it for
models that are expensive to build or need a device the driver lacks.

The contract of a model class (see :class:`Predictor`):

- ``__init__(self, ..., device=None)``: load the model. ``map_batches(device=...)`` passes
  ``device`` only when it is not ``None``; a class whose ``__init__`` takes no ``device``
  parameter (nor ``**kwargs``) cannot be given one (:class:`ConfigurationError`).
- ``__call__(self, batch: pa.RecordBatch)`` returns the outputs: a dict of column → NumPy
  array, torch tensor (moved to the CPU and converted), Arrow array or list; or a
  ``RecordBatch``/``Table``/DataFrame. Arrays with more than one dimension become
  ``arrow.fixed_shape_tensor`` columns.
- Keeping input columns next to the predictions (ids, labels): either return them from
  ``__call__``, or name them in ``map_batches(passthrough=["id"])`` and return only the
  predictions (one row per input row).

Examples
--------
>>> import numpy as np, feedline as fl
>>> class Doubler(Predictor):
...     def __call__(self, batch):
...         return {"twice": 2 * batch["id"].to_numpy()}
>>> preds = fl.range(5).map_batches(Doubler, batch_size=2, passthrough=["id"])
>>> preds.to_arrow().to_pydict()
{'id': [0, 1, 2, 3, 4], 'twice': [0, 2, 4, 6, 8]}
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from feedline.errors import ConfigurationError, MissingDependencyError, UserFunctionError

__all__ = [
    "Predictor",
    "TorchPredictor",
    "accepts_device",
    "add_passthrough",
    "check_device",
    "check_model_options",
    "validate_device",
]

_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps")


class Predictor:
    """Base class (optional) documenting the model-class contract of ``map_batches``.

    Subclasses load their model in ``__init__`` (built once per worker) and return a dict of
    output columns from ``__call__`` (called per batch). Inheriting is not required: any
    class with the same two methods works.

    Parameters
    ----------
    device:
        Where the model should run (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``), as given
        to ``map_batches(device=...)``; ``None`` when none was given.

    Examples
    --------
    >>> class Mean(Predictor):
    ...     def __call__(self, batch):
    ...         return {"mean": batch["x"].to_numpy(zero_copy_only=False).mean(axis=1)}
    >>> Mean(device="cpu").device
    'cpu'
    """

    def __init__(self, device: str | None = None) -> None:
        self.device = device

    def __call__(self, batch: pa.RecordBatch) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} does not define __call__. Fix: implement "
            "__call__(self, batch) returning a dict of output columns."
        )


def validate_device(device: str | None) -> str | None:
    """Check the spelling of a device name (not whether the device exists here).

    Examples
    --------
    >>> validate_device("cuda:0")
    'cuda:0'
    >>> validate_device("gpu")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: device='gpu' is not a device name. Fix: ...
    """
    if device is None:
        return None
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ConfigurationError(
            f"device={device!r} is not a device name. Fix: use 'cpu', 'cuda', "
            "'cuda:<index>', 'mps' or None."
        )
    return device


def check_model_options(
    fn: Any,
    device: str | None,
    constructor_kwargs: Mapping[str, Any] | None,
    concurrency: int | None,
) -> str | None:
    """Validate the model arguments of ``map_batches``; returns the device.

    Examples
    --------
    >>> check_model_options(Predictor, "cuda:1", None, 2)
    'cuda:1'
    """
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise ConfigurationError(
            f"concurrency={concurrency!r} must be a positive int. Fix: pass e.g. "
            "concurrency=2, or None."
        )
    device = validate_device(device)
    if device is not None and not isinstance(fn, type):
        raise ConfigurationError(
            f"device={device!r} only applies when fn is a class (built once per worker). "
            "Fix: pass a class whose __init__ takes device, or move the model to the "
            "device inside the function."
        )
    if device is not None and not accepts_device(fn):
        raise ConfigurationError(
            f"device={device!r} was given, but {fn.__qualname__}.__init__ takes no "
            "'device' parameter. Fix: add a device=None parameter to __init__ (or "
            "subclass feedline.plan.inference.Predictor), or drop device=."
        )
    if device is not None and "device" in (constructor_kwargs or {}):
        raise ConfigurationError(
            "device is given both as device= and in fn_constructor_kwargs. Fix: pass it "
            "once, as device=."
        )
    return device


def accepts_device(cls: type) -> bool:
    """True when ``cls(...)`` takes a ``device`` keyword (a parameter or ``**kwargs``).

    Examples
    --------
    >>> class Free:
    ...     def __init__(self, **options): ...
    >>> accepts_device(Predictor), accepts_device(Free), accepts_device(int)
    (True, True, False)
    """
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "device" and p.kind is not inspect.Parameter.POSITIONAL_ONLY)
        for p in signature.parameters.values()
    )


def check_device(device: str | None, where: str) -> None:
    """Raise :class:`ConfigurationError` when ``device`` is not usable in this process.

    Availability is checked with torch when torch is installed (``cuda``, ``mps``); without
    torch the model class is trusted to use the device itself. ``"cpu"`` always passes.

    Examples
    --------
    >>> check_device("cpu", "here")
    >>> check_device(None, "here")
    """
    if device is None or device == "cpu":
        return
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return
    import torch

    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= count:
            raise ConfigurationError(
                f"device={device!r} was asked for {where}, but this process sees "
                f"{count} CUDA device(s) (torch {torch.__version__}, "
                f"cuda build: {torch.version.cuda or 'none'}). Fix: run on a machine with a "
                "GPU and a CUDA build of torch, or pass device='cpu' (or None)."
            )
    elif device == "mps" and not torch.backends.mps.is_available():
        raise ConfigurationError(
            f"device='mps' was asked for {where}, but torch reports no MPS device here. "
            "Fix: run on Apple silicon with an MPS build of torch, or pass device='cpu'."
        )


def add_passthrough(
    inputs: pa.RecordBatch, outputs: pa.RecordBatch, columns: Sequence[str], where: str
) -> pa.RecordBatch:
    """``columns`` of ``inputs`` followed by the columns of ``outputs`` (row for row).

    Examples
    --------
    >>> ins = pa.record_batch({"id": [7, 8], "x": [0.5, 1.5]})
    >>> add_passthrough(ins, pa.record_batch({"y": [1, 3]}), ["id"], "m").to_pydict()
    {'id': [7, 8], 'y': [1, 3]}
    """
    missing = [c for c in columns if inputs.schema.get_field_index(c) < 0]
    if missing:
        raise UserFunctionError(
            f"passthrough column(s) {missing} are not in the batches given to {where} "
            f"(columns: {inputs.schema.names}). Fix: name existing input columns."
        )
    if outputs.num_rows != inputs.num_rows:
        raise UserFunctionError(
            f"{where} returned {outputs.num_rows} rows for a batch of {inputs.num_rows}; "
            "passthrough= needs one output row per input row. Fix: return one prediction "
            "per row, or return the input columns yourself and drop passthrough=."
        )
    clash = [c for c in columns if outputs.schema.get_field_index(c) >= 0]
    if clash:
        raise UserFunctionError(
            f"{where} returned column(s) {clash} that passthrough= also copies from the "
            "input. Fix: drop them from the outputs or from passthrough=."
        )
    arrays = [inputs.column(c) for c in columns] + list(outputs.columns)
    return pa.RecordBatch.from_arrays(arrays, names=[*columns, *outputs.schema.names])


class TorchPredictor(Predictor):
    """A torch model as a ``map_batches`` class: features in, one output column out.

    Parameters
    ----------
    model_factory:
        Builds the ``torch.nn.Module`` (called once per worker; load weights here). On the
        local engine the workers are threads: do not seed torch's global RNG here (the
        threads share it); use a ``torch.Generator`` of its own or load saved weights.
    input_columns:
        Numeric columns stacked as features (``float32``, shape ``(rows, n)``); a single
        ``arrow.fixed_shape_tensor`` column is passed with its own shape.
    output:
        Name of the output column (the model's output, converted to NumPy on the CPU).
    device:
        Where to run the model (``None``: ``"cpu"``).

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa, torch
    >>> def make_model():
    ...     torch.manual_seed(0)
    ...     return torch.nn.Linear(2, 1)
    >>> ds = fl.from_arrow(pa.table({"id": [0, 1, 2], "a": [1.0, 2.0, 3.0], "b": [0.0, 1.0, 0.0]}))
    >>> preds = ds.map_batches(
    ...     TorchPredictor,
    ...     fn_constructor_kwargs={"model_factory": make_model, "input_columns": ["a", "b"]},
    ...     batch_size=2, device="cpu", passthrough=["id"])
    >>> preds.to_arrow().column_names
    ['id', 'prediction']
    """

    def __init__(
        self,
        model_factory: Callable[[], Any],
        input_columns: Sequence[str],
        output: str = "prediction",
        device: str | None = None,
    ) -> None:
        try:
            import torch
        except ModuleNotFoundError as exc:
            raise MissingDependencyError("torch", "torch", "TorchPredictor") from exc
        super().__init__(device or "cpu")
        self.torch = torch
        self.model = model_factory().to(self.device).eval()
        self.input_columns = list(input_columns)
        self.output = output

    def features(self, batch: pa.RecordBatch) -> Any:
        """The model input: the feature columns as one float32 tensor on the device."""
        columns = [batch.column(c) for c in self.input_columns]
        if len(columns) == 1 and isinstance(columns[0].type, pa.FixedShapeTensorType):
            array = columns[0].to_numpy_ndarray()
        else:
            array = np.stack([c.to_numpy(zero_copy_only=False) for c in columns], axis=1)
        return self.torch.from_numpy(np.ascontiguousarray(array, np.float32)).to(self.device)

    def __call__(self, batch: pa.RecordBatch) -> dict[str, Any]:
        with self.torch.inference_mode():
            out = self.model(self.features(batch))
        if out.ndim == 2 and out.shape[1] == 1:
            out = out[:, 0]
        return {self.output: out}
