"""``Chain`` (several preprocessors as one) and ``Concat`` (assemble a feature tensor)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import ConfigurationError, DataError, FormatError, SchemaError
from feedline.preprocess.preprocessor import Preprocessor, from_state, register
from feedline.preprocess.scalers import float_values, is_numeric, tensor_array
from feedline.preprocess.state_checks import invalid_state
from feedline.ui.progress import bar as progress_bar
from feedline.ui.progress import counting, scope

if TYPE_CHECKING:
    from feedline.dataset.dataset import Dataset
    from feedline.engines.protocol import Engine

__all__ = ["Chain", "Concat"]


@register
class Chain(Preprocessor):
    """Apply several preprocessors in order, as one preprocessor with one state.

    Fitting is sequential: each step is fitted on the output of the steps before it.
    Consecutive unfitted steps that do not read what the others in the run write (and do
    not drop rows) are fitted together in one pass over the data. The state is the list of
    the steps' states; :func:`~feedline.preprocess.from_state` rebuilds the whole chain.

    Parameters
    ----------
    steps:
        Preprocessors, fitted or not.

    Examples
    --------
    >>> import feedline as fl, pyarrow as pa
    >>> from feedline.preprocess.preprocessor import from_state
    >>> from feedline.preprocess.chain import Chain
    >>> from feedline.preprocess.imputer import Imputer
    >>> from feedline.preprocess.scalers import StandardScaler
    >>> ds = fl.from_arrow(pa.table({"x": [1.0, None, 3.0]}))
    >>> chain = Chain([Imputer("x"), StandardScaler("x")]).fit(ds)
    >>> chain.transform_record({"x": None})
    {'x': 0.0}
    >>> from_state(chain.state).transform_record({"x": 3.0})
    {'x': 1.224744871391589}
    """

    def __init__(self, steps: Sequence[Preprocessor]) -> None:
        steps = tuple(steps)
        bad = [s for s in steps if not isinstance(s, Preprocessor)]
        if not steps or bad:
            raise ConfigurationError(
                f"Chain needs a non-empty list of feedline preprocessors, got {list(steps)!r}. "
                "Fix: e.g. fl.Chain([fl.Imputer('x'), fl.StandardScaler('x')])."
            )
        needed: list[str] = []
        made: set[str] = set()
        for step in steps:
            needed += [c for c in step.columns if c not in made and c not in needed]
            made.update(step.output)
        super().__init__(needed)
        self.output = tuple(dict.fromkeys(c for s in steps for c in s.output))
        self.steps = steps

    @property
    def is_fitted(self) -> bool:
        return all(step.is_fitted for step in self.steps)

    @property
    def drops_rows(self) -> bool:
        """True when a step may drop rows."""
        return any(getattr(step, "drops_rows", False) for step in self.steps)

    def params(self) -> dict[str, Any]:
        return {"steps": [step.state for step in self.steps]}

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> Preprocessor:
        try:
            steps = state["params"]["steps"]
        except (KeyError, TypeError) as exc:
            raise FormatError(
                f"Cannot rebuild Chain from its saved state: {exc}. Fix: pass the dict that "
                "Chain.state produced (re-fit and save it again if it was edited)."
            ) from exc
        return cls([from_state(s) for s in steps])

    def fit(
        self,
        ds: Dataset,
        *,
        fraction: float | None = None,
        seed: int = 0,
        engine: str | Engine | None = None,
        progress: bool | None = None,
    ) -> Preprocessor:
        """Return a fitted copy: each step fitted on the previous steps' output (``progress``:
        as in :meth:`Preprocessor.fit`, for every step)."""
        with scope(progress):
            return self._fit(ds, fraction, seed, engine)

    def _fit(
        self, ds: Dataset, fraction: float | None, seed: int, engine: str | Engine | None
    ) -> Preprocessor:
        # one sample for every pass, checked on the input columns the steps fit
        names = set(ds.schema().names) if fraction is not None else set()
        inputs = [c for step in self.steps for c in step.fit_columns() if c in names]
        data = ds.fit_sample(fraction, seed, engine=engine, columns=list(dict.fromkeys(inputs)))
        fitted: list[Preprocessor] = []
        i = 0
        while i < len(self.steps):
            group = _fit_group(self.steps, i)
            if len(group) == 1 and (group[0].is_fitted or not _aggregates(group[0])):
                step = group[0] if group[0].is_fitted else group[0].fit(data, engine=engine)
                done = [step]
            else:
                done = _fit_together(group, data, engine)
            for step in done:
                fitted.append(step)
                data = data.transform(step)
            i += len(group)
        return Chain(fitted)

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        for step in self.steps:
            batch = step.transform_batch(batch, report=report, where=where)
        return batch

    def __repr__(self) -> str:
        return f"Chain([{', '.join(repr(s) for s in self.steps)}])"


def _aggregates(step: Preprocessor) -> bool:
    """True when ``step`` fits through the generic partial/merge/finish path."""
    return step.needs_fit and type(step).fit is Preprocessor.fit


def _fit_group(steps: tuple[Preprocessor, ...], start: int) -> list[Preprocessor]:
    """The longest run from ``start`` that can be fitted in one pass (at least one step)."""
    group = [steps[start]]
    if steps[start].is_fitted or not _aggregates(steps[start]):
        return group
    written = set(steps[start].output)
    for step in steps[start + 1 :]:
        if (
            step.is_fitted
            or not _aggregates(step)
            or getattr(group[-1], "drops_rows", False)
            or written.intersection(step.fit_columns())
        ):
            break
        group.append(step)
        written.update(step.output)
    return group


def _fit_together(
    group: list[Preprocessor], data: Dataset, engine: str | Engine | None
) -> list[Preprocessor]:
    columns = list(dict.fromkeys(c for step in group for c in step.fit_columns()))
    with progress_bar(f"fit {', '.join(map(repr, group))}") as advance:
        merged = data.aggregate(
            counting(lambda batch: tuple(step.partial(batch) for step in group), advance, engine),
            lambda a, b: tuple(step.merge(x, y) for step, x, y in zip(group, a, b, strict=True)),
            engine=engine,
            columns=columns,
        )
    if merged is None:
        raise ConfigurationError(
            f"{group[0]!r} cannot be fitted: the data (or the sample) has no rows. Fix: fit on "
            "a larger fraction or check the filter."
        )
    out = []
    for step, part in zip(group, merged, strict=True):
        fitted = copy.copy(step)
        fitted.fitted = step.finish(part)
        out.append(fitted)
    return out


# ---------------------------------------------------------------------- Concat


@register
class Concat(Preprocessor):
    """Assemble numeric and tensor columns into one fixed-shape float tensor column.

    Scalars take one slot, fixed-shape tensor (and fixed-size list) columns are flattened
    in row-major order. Fitting reads only the schema and records the layout
    (``fitted["layout"]``: column, shape, offset), which ``transform`` then checks, so
    serving-time records must have the same shapes; :attr:`feature_names` names each slot.

    Parameters
    ----------
    columns:
        The columns to assemble, in order.
    output:
        The output column (default ``"features"``), shape ``(n_features,)``.
    dtype:
        ``"float32"`` (default), ``"float64"`` or ``"float16"``.
    handle_invalid:
        Rows with a null or NaN value: ``"error"`` (:class:`~feedline.errors.DataError`
        naming the column), ``"keep"`` (NaN in the tensor) or ``"skip"`` (drop the row).
    drop_inputs:
        Remove the assembled columns from the output (default ``True``).

    Examples
    --------
    >>> import feedline as fl, numpy as np, pyarrow as pa
    >>> from feedline.preprocess.chain import Concat
    >>> emb = pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((2, 2), dtype=np.float32))
    >>> ds = fl.from_arrow(pa.table({"a": [1, 2], "emb": emb, "y": [0, 1]}))
    >>> cat = Concat(["a", "emb"]).fit(ds)
    >>> cat.feature_names
    ['a', 'emb[0]', 'emb[1]']
    >>> out = ds.transform(cat).to_arrow()
    >>> out.column_names, out["features"].combine_chunks().to_numpy_ndarray().tolist()
    (['y', 'features'], [[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]])
    """

    def __init__(
        self,
        columns: str | Sequence[str],
        output: str | Sequence[str] = "features",
        dtype: str = "float32",
        handle_invalid: str = "error",
        drop_inputs: bool = True,
    ) -> None:
        super().__init__(columns, output)
        if len(self.output) != 1:
            raise ConfigurationError(
                f"Concat writes one column; got output={output!r}. Fix: pass one name, e.g. "
                "output='features'."
            )
        if str(np.dtype(dtype)) not in ("float16", "float32", "float64"):
            raise ConfigurationError(
                f"Concat(dtype={dtype!r}). Fix: use 'float32', 'float64' or 'float16'."
            )
        if handle_invalid not in ("error", "keep", "skip"):
            raise ConfigurationError(
                f"Concat(handle_invalid={handle_invalid!r}). Fix: use 'error', 'keep' or 'skip'."
            )
        self.dtype = str(np.dtype(dtype))
        self.handle_invalid = handle_invalid
        self.drop_inputs = bool(drop_inputs)

    @property
    def drops_rows(self) -> bool:
        return self.handle_invalid == "skip"

    def params(self) -> dict[str, Any]:
        return super().params() | {
            "dtype": self.dtype,
            "handle_invalid": self.handle_invalid,
            "drop_inputs": self.drop_inputs,
        }

    def _check_fitted(self) -> None:
        """The saved layout must list every column in order, with consistent offsets."""
        if self.fitted is None:
            return
        owner = self._state_owner()
        layout = self.fitted.get("layout") if isinstance(self.fitted, dict) else None
        if not isinstance(layout, list) or len(layout) != len(self.columns):
            raise invalid_state(
                owner, "fitted.layout", layout, f"is not a list of {len(self.columns)} entries"
            )
        offset = 0
        for i, (item, column) in enumerate(zip(layout, self.columns, strict=True)):
            field = f"fitted.layout[{i}]"
            if not isinstance(item, dict) or item.get("column") != column:
                raise invalid_state(owner, field, item, f"does not describe column {column!r}")
            shape = item.get("shape")
            if not isinstance(shape, list) or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape
            ):
                raise invalid_state(owner, f"{field}.shape", shape, "is not a list of sizes >= 1")
            if item.get("offset") != offset:
                raise invalid_state(
                    owner, f"{field}.offset", item.get("offset"), f"is not {offset}"
                )
            offset += int(np.prod(shape)) if shape else 1

    def fit(
        self,
        ds: Dataset,
        *,
        fraction: float | None = None,
        seed: int = 0,
        engine: str | Engine | None = None,
        progress: bool | None = None,
    ) -> Preprocessor:
        """Record the layout from ``ds``'s schema (no pass over the data, no progress bar)."""
        fitted = copy.copy(self)
        fitted.fitted = {"layout": self._layout(ds.schema(), "the dataset")}
        return fitted

    @property
    def feature_names(self) -> list[str]:
        """One name per slot of the output tensor: ``col`` or ``col[i]`` / ``col[i, j]``."""
        if self.fitted is None:
            raise self._not_fitted_error()
        names = []
        for item in self.fitted["layout"]:
            shape = item["shape"]
            if not shape:
                names.append(item["column"])
            else:
                names += [f"{item['column']}[{', '.join(map(str, i))}]" for i in np.ndindex(*shape)]
        return names

    def _layout(self, schema: pa.Schema, where: str) -> list[dict[str, Any]]:
        layout, offset = [], 0
        for column in self.columns:
            dtype = schema.field(column).type
            shape = _shape_of(dtype)
            if shape is None:
                raise SchemaError(
                    f"Concat cannot assemble column {column!r} of type {dtype} in {where}. Fix: "
                    "use numeric or fixed-shape tensor columns (encode strings first)."
                )
            layout.append({"column": column, "shape": shape, "offset": offset})
            offset += int(np.prod(shape)) if shape else 1
        return layout

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        assert self.fitted is not None
        parts, invalid = [], np.zeros(batch.num_rows, dtype=bool)
        for want in self.fitted["layout"]:
            column, array = want["column"], batch.column(want["column"])
            if _is_list(array.type):  # e.g. a served record: nested Python lists
                values = _lists_matrix(self, array, want, where)
            else:
                shape = _shape_of(array.type)
                if shape != want["shape"]:
                    raise SchemaError(
                        f"Concat: column {column!r} in {where} has type {array.type} (shape "
                        f"{shape}), but it was fitted with shape {want['shape']}. Fix: give it "
                        "the fitted shape."
                    )
                values = _as_matrix(self, array, column, where)
            bad = np.isnan(values).any(axis=1)
            if bad.any() and self.handle_invalid == "error":
                raise DataError(
                    f"Concat: column {column!r} in {where} has a null or NaN value (row "
                    f"{int(np.argmax(bad))}). Fix: impute it first (fl.Imputer), or pass "
                    "handle_invalid='keep' or 'skip'."
                )
            invalid |= bad
            parts.append(values)
        matrix = np.concatenate(parts, axis=1).astype(self.dtype)
        out = batch.drop_columns(list(self.columns)) if self.drop_inputs else batch
        name = self.output[0]
        if name in out.schema.names:
            out = out.drop_columns([name])
        out = out.append_column(name, tensor_array(matrix))
        if self.handle_invalid == "skip" and invalid.any():
            out = out.filter(pa.array(~invalid))
            if report is not None:
                report.add(records_skipped=int(invalid.sum()))
        return out


def _shape_of(dtype: pa.DataType) -> list[int] | None:
    """``[]`` for numeric scalars, the shape of tensor / fixed-size-list columns, else None."""
    if is_numeric(dtype):
        return []
    if isinstance(dtype, pa.FixedShapeTensorType) and is_numeric(dtype.value_type):
        return [int(d) for d in dtype.shape]
    if pa.types.is_fixed_size_list(dtype) and is_numeric(dtype.value_type):
        return [int(dtype.list_size)]
    return None


def _is_list(dtype: pa.DataType) -> bool:
    return pa.types.is_list(dtype) or pa.types.is_large_list(dtype)


def _lists_matrix(owner: Preprocessor, array: Any, want: dict[str, Any], where: str) -> Any:
    """``(rows, width)`` float64 from (nested) list values with ``width`` leaves per row."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    width = int(np.prod(want["shape"])) if want["shape"] else 1
    owner_row, level = np.arange(len(array)), array
    while _is_list(level.type) or pa.types.is_fixed_size_list(level.type):
        owner_row = owner_row[pc.list_parent_indices(level).to_numpy()]
        level = pc.list_flatten(level)
    counts = np.bincount(owner_row, minlength=len(array))
    null = array.is_null().to_numpy(zero_copy_only=False)
    if np.any(counts[~null] != width):
        row = int(np.argmax((counts != width) & ~null))
        raise SchemaError(
            f"Concat: column {want['column']!r} in {where} has {counts[row]} value(s) in row "
            f"{row}, but it was fitted with shape {want['shape']}. Fix: give it the fitted shape."
        )
    matrix = np.full((len(array), width), np.nan)
    leaves = float_values(owner, level, want["column"], where)
    matrix[~null] = leaves.reshape(-1, width)
    return matrix


def _as_matrix(owner: Preprocessor, array: Any, column: str, where: str) -> np.ndarray:
    """``(rows, width)`` float64 values, NaN for nulls (a null tensor row is all NaN)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if not pa.types.is_fixed_size_list(array.type):
        return float_values(owner, array, column, where).reshape(-1, 1)
    width = array.type.list_size
    flat = array.values.slice(array.offset * width, len(array) * width)
    matrix = float_values(owner, flat, column, where).reshape(len(array), width)
    if array.null_count:
        matrix = matrix.copy()
        matrix[array.is_null().to_numpy(zero_copy_only=False)] = np.nan
    return matrix
