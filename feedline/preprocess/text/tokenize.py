"""Tokenize a text column into fixed-length ``int32`` ids plus an attention mask.

Any Hugging Face ``tokenizer.json`` works (run by the Rust ``tokenizers`` library, whose
``encode_batch`` releases the GIL), and so does OpenAI CLIP's BPE
(:class:`~feedline.preprocess.text.clip_bpe.ClipTokenizer`, selected with ``"clip:<path>"``).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from feedline.errors import (
    ConfigurationError,
    DataError,
    FeedlineError,
    FormatError,
    MissingDependencyError,
    SchemaError,
)
from feedline.preprocess.preprocessor import Preprocessor, register
from feedline.preprocess.text.clip_bpe import CACHE_SIZE, ClipTokenizer
from feedline.preprocess.text.token_arrays import frame, pack, tensor_array
from feedline.preprocess.text.token_files import read_source

__all__ = ["Tokenize"]

_PAD_NAMES = ("[PAD]", "<pad>", "<|pad|>", "<PAD>", "[pad]")
_SEPARABLE = {
    "normalizer": {
        "BertNormalizer",
        "Lowercase",
        "NFC",
        "NFD",
        "NFKC",
        "NFKD",
        "StripAccents",
        "Strip",
    },
    "pre_tokenizer": {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits"},
    "post_processor": {"TemplateProcessing", "BertProcessing", "RobertaProcessing"},
}
_PROBES = ["Hello, World!  It's 12.5% off", "a\tb\nc  d ", " x ", "naïve café 日本語 😀 ½", ""]


def _types(part: Any) -> list[Any]:
    if part and part.get("type") == "Sequence":
        keys = [k for k in ("normalizers", "pretokenizers", "processors") if k in part]
        return [t for child in (part[keys[0]] if keys else []) for t in _types(child)]
    return [part.get("type")] if part else []


def _separable(spec: dict[str, Any]) -> bool:
    """Whether the ids of a text are the ids of its space-separated chunks, concatenated.

    True for pipelines made of the parts in ``_SEPARABLE`` only: the normalizers act per
    character, a splitter drops spaces, the model acts per word, the post-processor adds
    fixed ids around the text, and no added token holds whitespace.
    """
    try:
        kinds = {key: set(_types(spec.get(key))) for key in _SEPARABLE}
        model, tokens = spec.get("model") or {}, spec.get("added_tokens") or []
        return (
            all(kinds[key] <= allowed for key, allowed in _SEPARABLE.items())
            and bool(kinds["pre_tokenizer"] & {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
            and model.get("type") in {"WordPiece", "WordLevel", "BPE", "Unigram"}
            and not model.get("dropout")
            and not any(any(c.isspace() for c in t["content"]) for t in tokens)
            and (spec.get("truncation") or {}).get("direction", "right") == "right"
        )
    except (AttributeError, KeyError, TypeError):
        return False


class _HFBackend:
    """A private copy of a ``tokenizers.Tokenizer``; ``frame`` pads (and, chunked, truncates).

    When the pipeline is separable (see ``_SEPARABLE``, confirmed on probe texts) the ids of
    each space-separated chunk are cached, and only unseen chunks go to Rust: typical text
    repeats its words. Arrow splits the texts and dictionary-encodes the chunks, Python
    touches each distinct chunk of a batch once (a cache lookup), and NumPy gathers every
    row's ids (see :func:`gather_chunks`), so most of the work releases the GIL.
    """

    def __init__(
        self, tokenizer: Any, spec: dict[str, Any], max_length: int | None, truncation: bool
    ) -> None:
        padding, cut = tokenizer.padding or {}, tokenizer.truncation or {}
        self.left = padding.get("direction") == "left"
        ids = [padding.get("pad_id"), *map(tokenizer.token_to_id, _PAD_NAMES), 0]
        self.pad_id = next(i for i in ids if i is not None)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        self._encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
        self._cache: dict[str, list[int]] = {}
        self.specials = None
        self.specials = self._specials() if _separable(spec) else None
        if self.specials is None and truncation and max_length is not None:
            tokenizer.enable_truncation(
                max_length,
                strategy=cut.get("strategy", "longest_first"),
                direction=cut.get("direction", "right"),
            )

    def _specials(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """The ids added before and after the text, if the chunked route is exact."""
        whole = [e.ids for e in self._encode(_PROBES, add_special_tokens=False)]
        flat, lengths = self.encode_ids(_PROBES, False, chunked=True)[:2]
        if [a.tolist() for a in np.split(flat, np.cumsum(lengths)[:-1])] != whole:
            return None
        found: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        for probe, bare in zip(_PROBES, whole, strict=True):
            full, n = self.tokenizer.encode(probe).ids, len(bare)
            starts = [k for k in range(len(full) - n + 1) if bare and full[k : k + n] == bare]
            found.update((tuple(full[:k]), tuple(full[k + n :])) for k in starts[:1])
        return found.pop() if len(found) == 1 else None

    def encode_ids(
        self, texts: Sequence[str] | pa.Array, add_special_tokens: bool, chunked: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], tuple[int, ...]]:
        """Packed ids (see ``pack``), and the ids to put before and after each row.

        ``texts``: a list of strings, or an Arrow string array without nulls.
        """
        if not (self.specials is not None if chunked is None else chunked):
            texts = texts.to_pylist() if isinstance(texts, pa.Array) else list(texts)
            encodings = self._encode(texts, add_special_tokens=add_special_tokens)
            return (*pack([e.ids for e in encodings]), (), ())
        array = texts if isinstance(texts, pa.Array) else pa.array(texts, pa.string())
        flat, lengths = self._chunk_ids(array)
        prefix, suffix = self.specials if add_special_tokens and self.specials else ((), ())
        return flat, lengths, prefix, suffix

    def _chunk_ids(self, array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Packed ids of the texts (no special tokens), joined from the ids of their chunks."""
        pieces = pc.split_pattern(array, " ")  # as str.split(" "): "a  b" -> a, "", b
        per_row = pieces.value_lengths().to_numpy(zero_copy_only=False)
        encoded = pc.dictionary_encode(pieces.flatten())
        chunks = encoded.dictionary.to_pylist()
        cache = self._cache
        missing = [c for c in chunks if c not in cache]
        if missing:
            if len(cache) + len(missing) > CACHE_SIZE:
                cache = {c: cache[c] for c in chunks if c in cache}
            encodings = self._encode(missing, add_special_tokens=False)
            cache.update(zip(missing, (e.ids for e in encodings), strict=True))
            self._cache = cache
        ids, sizes = pack([cache[c] for c in chunks])
        return gather_chunks(ids, sizes, encoded.indices.to_numpy(zero_copy_only=False), per_row)


def gather_chunks(
    ids: np.ndarray, sizes: np.ndarray, which: np.ndarray, per_row: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Join the ids of each row's chunks, vectorized.

    Distinct chunk ``j`` has the ids ``ids[start_j : start_j + sizes[j]]`` (packed, in
    order); the data's ``k``-th chunk is distinct chunk ``which[k]``, and row ``i`` is made
    of the next ``per_row[i]`` chunks. Returns the rows' ids packed and their lengths.

    Examples
    --------
    >>> ids, sizes = np.array([7, 8, 9], np.int32), np.array([2, 1])  # "ab" -> 7 8, "c" -> 9
    >>> flat, lengths = gather_chunks(ids, sizes, np.array([1, 0, 0]), np.array([2, 1]))
    >>> flat.tolist(), lengths.tolist()
    ([9, 7, 8, 7, 8], [3, 2])
    """
    starts = np.cumsum(sizes) - sizes
    counts = sizes[which]  # ids of each chunk of the data
    ends = np.cumsum(counts)
    shift = np.repeat(starts[which] - (ends - counts), counts)
    flat = ids[np.arange(int(ends[-1]) if len(ends) else 0) + shift]
    row_ends = np.concatenate([[0], ends])[np.cumsum(per_row, dtype=np.int64)]
    return flat, np.diff(row_ends, prepend=0)


def _variable_lists(
    flat: np.ndarray, lengths: np.ndarray, prefix: Sequence[int], suffix: Sequence[int]
) -> tuple[pa.Array, pa.Array]:
    """``list<int32>`` ids (``prefix + ids + suffix`` per row) and ``list<int8>`` ones."""
    lengths = lengths.astype(np.int64)
    extra = len(prefix) + len(suffix)
    sizes = lengths + extra
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    ids = np.empty(int(offsets[-1]), dtype=np.int32)
    starts = offsets[:-1]
    body = np.repeat(starts + len(prefix) - np.concatenate([[0], np.cumsum(lengths)[:-1]]),
                     lengths)  # fmt: skip
    ids[body + np.arange(len(flat))] = flat
    for k, token in enumerate(prefix):
        ids[starts + k] = token
    for k, token in enumerate(suffix):
        ids[starts + len(prefix) + lengths + k] = token
    cuts = pa.array(offsets.astype(np.int32))
    return (pa.ListArray.from_arrays(cuts, pa.array(ids)),
            pa.ListArray.from_arrays(cuts, pa.array(np.ones(len(ids), dtype=np.int8))))  # fmt: skip


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:
        raise MissingDependencyError("tokenizers", "text", "Tokenize") from exc
    return tokenizers


@register
class Tokenize(Preprocessor):
    """Tokenize a string column into fixed-length ids and an attention mask.

    Parameters
    ----------
    column:
        A ``string``, ``large_string``, ``string_view`` or dictionary-of-string column.
    tokenizer:
        A path or fsspec URL of a Hugging Face ``tokenizer.json``; a ``tokenizers.Tokenizer``
        (copied; its JSON goes into ``state``); ``"clip:<merges file>"`` or a
        :class:`~feedline.preprocess.text.clip_bpe.ClipTokenizer` for OpenAI CLIP's BPE
        (``"clip:"`` is its fast preset; ``ClipTokenizer(path, preset="open_clip")`` gives
        open_clip's ids exactly, with ftfy; the ids column stays ``int32``).
    max_length:
        Row length (CLIP: 77). ``None``: every text's ids as they are, a variable-length
        ``list<int32>`` per row without padding or truncation (``pad`` and ``truncation`` do
        not apply): documents for packing (``ds.loader(pack=fl.Packing(...))``).
    pad:
        Pad to ``max_length``: ids and mask are ``arrow.fixed_shape_tensor`` columns of shape
        ``(max_length,)``; with ``pad=False`` they are ``list`` columns.
    add_special_tokens:
        Add the tokenizer's special tokens (``[CLS]``/``[SEP]``; CLIP's start/end tokens).
    truncation:
        Cut longer texts (CLIP keeps its end token); without it a longer text raises
        ``DataError`` when padding.
    output, mask_output:
        Names of the ids column (default: replaces ``column``) and of the ``int8`` mask
        column (1 = token, 0 = padding; default ``f"{output}_mask"``, right after the ids).
    pad_id:
        Default: the tokenizer's padding id, else its ``[PAD]``/``<pad>`` id, else 0 (CLIP: 0).
    on_null:
        ``"raise"`` (``DataError`` naming the column and row) or ``"empty"`` (as ``""``).
    sha256:
        Expected SHA-256 of the tokenizer file. ``state`` records it, so a changed file is
        refused with ``IntegrityError`` when the state is loaded.

    Notes
    -----
    The tokenizer is loaded once per process (when created, or lazily after unpickling on a
    Spark/Ray worker) and shared by the worker threads. Padding (and, on the chunked route,
    truncation) is done in NumPy, with the same result as ``enable_padding``/``truncation``.

    Examples
    --------
    >>> import tempfile, os, pyarrow as pa
    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> tok = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hi": 2, "you": 3}, "[UNK]"))
    >>> tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> path = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
    >>> tok.save(path)
    >>> t = Tokenize("text", path, max_length=4)
    >>> out = t.transform_batch(pa.record_batch({"text": ["hi you", "hi there"]}))
    >>> out.schema.names
    ['text', 'text_mask']
    >>> out["text"].to_numpy_ndarray().tolist()
    [[2, 3, 0, 0], [2, 1, 0, 0]]
    >>> t.transform_record({"text": "you"})["text_mask"]
    [1, 0, 0, 0]
    """

    needs_fit = False

    def __init__(
        self,
        column: str,
        tokenizer: Any,
        max_length: int | None,
        pad: bool = True,
        add_special_tokens: bool = True,
        truncation: bool = True,
        output: str | None = None,
        mask_output: str | None = None,
        *,
        pad_id: int | None = None,
        on_null: str = "raise",
        sha256: str | None = None,
    ) -> None:
        if not isinstance(column, str):
            raise ConfigurationError(
                f"Tokenize needs one column name, got {column!r}. Fix: one Tokenize per column."
            )
        out = output or column
        mask = mask_output or f"{out}_mask"
        super().__init__(column, (out, mask))
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
        ):
            raise ConfigurationError(
                f"Tokenize: max_length must be a positive int or None, got {max_length!r}. Fix: "
                "e.g. 77, or None for variable-length ids (packing)."
            )
        if max_length is None:
            pad = truncation = False
        if on_null not in ("raise", "empty"):
            raise ConfigurationError(f"on_null={on_null!r}. Fix: use 'raise' or 'empty'.")
        if mask == out:
            raise ConfigurationError(
                f"Tokenize: output and mask_output are both {out!r}. Fix: give them different "
                "names."
            )
        self.column, self.max_length, self.pad_id = column, max_length, pad_id
        self.pad, self.add_special_tokens = bool(pad), bool(add_special_tokens)
        self.truncation, self.on_null, self.sha256 = bool(truncation), on_null, sha256
        self.source: str | None = None
        self.tokenizer_json: str | None = None
        self.clip_options: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._backend: Any = None  # a ClipTokenizer or a tokenizers.Tokenizer, built once
        self._resolve(tokenizer)

    def _resolve(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, ClipTokenizer):
            if self.sha256 is not None and self.sha256 != tokenizer.sha256:
                raise ConfigurationError(
                    "Tokenize: sha256 differs from the ClipTokenizer's file. Fix: pass the "
                    "sha256 of that merges file, or drop sha256=."
                )
            self.source, self.sha256 = f"clip:{tokenizer.path}", tokenizer.sha256
            self.clip_options = tokenizer.options()
            self._backend = tokenizer
        elif isinstance(tokenizer, str | os.PathLike):
            self.source = os.fspath(tokenizer)
            self._backend = self._load()
        elif type(tokenizer).__module__.startswith("tokenizers"):
            self.tokenizer_json, self.sha256 = tokenizer.to_str(), None
            self._backend = self._load()
        else:
            raise ConfigurationError(
                "Tokenize: tokenizer must be a tokenizer.json path, a tokenizers.Tokenizer, "
                f"'clip:<merges path>' or a ClipTokenizer; got {type(tokenizer).__name__}. "
                "Fix: pass one of those."
            )

    def _load(self) -> Any:
        """Build the backend (reads and checks the file); once per process."""
        if self.source is not None and self.source.startswith("clip:"):
            clip = ClipTokenizer(
                self.source[5:],
                self.max_length or 77,
                sha256=self.sha256,
                **(self.clip_options or {}),
            )
            self.sha256 = clip.sha256
            return clip
        tokenizers = _tokenizers()
        if self.tokenizer_json is not None:
            text, where = self.tokenizer_json, "the tokenizer given to Tokenize"
        else:
            assert self.source is not None  # no tokenizer JSON: a file to read
            data, self.sha256 = read_source(self.source, self.sha256)
            text, where = data.decode("utf-8", errors="replace"), repr(self.source)
        try:
            tokenizer, spec = tokenizers.Tokenizer.from_str(text), json.loads(text)
        except Exception as exc:  # the Rust parser raises plain Exception
            raise DataError(
                f"{where} is not a valid Hugging Face tokenizer.json: {exc}. Fix: pass the "
                "file written by tokenizer.save() / tokenizer_file of a fast tokenizer."
            ) from exc
        return _HFBackend(tokenizer, spec, self.max_length, self.truncation)

    def _get_backend(self) -> Any:
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    self._backend = self._load()
        return self._backend

    def _texts(self, array: pa.Array, where: str) -> pa.Array:
        """The column as a string array without nulls (``SchemaError``/``DataError`` else)."""
        kind = array.type
        if pa.types.is_dictionary(kind):
            array, kind = array.dictionary_decode(), kind.value_type
        if pa.types.is_null(kind):
            array = pa.nulls(len(array), pa.string())
        elif not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)
        ):
            raise SchemaError(
                f"Tokenize needs a string column, but {self.column!r} in {where} has type "
                f"{kind}. Fix: tokenize a text column, or convert this one to strings first."
            )
        if array.null_count:
            if self.on_null == "raise":
                first = int(np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))[0])
                raise DataError(
                    f"Tokenize: column {self.column!r} has {array.null_count} null value(s) in "
                    f"{where} (first at row {first} of the batch). Fix: fill or filter them, "
                    "or pass on_null='empty' to tokenize them as ''."
                )
            array = pc.fill_null(array, "")
        if pa.types.is_string_view(array.type):
            array = array.cast(pa.large_string())
        return array

    def _transform(self, batch: pa.RecordBatch, report: Any, where: str) -> pa.RecordBatch:
        index = batch.schema.get_field_index(self.column)
        texts = self._texts(batch.column(index), where)
        backend = self._get_backend()
        try:
            flat, lengths, prefix, suffix = backend.encode_ids(
                texts if isinstance(backend, _HFBackend) else texts.to_pylist(),
                self.add_special_tokens,
            )
        except FeedlineError:
            raise
        except Exception as exc:  # tokenizers raises plain Exception
            raise DataError(f"Tokenize failed on {where}: {exc}. Fix: check the text.") from exc
        if self.max_length is None:  # variable length: the ids as they are, no padding
            id_array, mask_array = _variable_lists(np.asarray(flat), np.asarray(lengths),
                                                   prefix, suffix)  # fmt: skip
            return self._assemble(batch, index, id_array, mask_array)
        pad_id = backend.pad_id if self.pad_id is None else self.pad_id
        ids, mask, lengths = frame(
            flat,
            lengths,
            self.max_length,
            pad_id,
            prefix=prefix,
            suffix=suffix,
            truncate=self.truncation,
            left=backend.left,
        )
        if self.pad and ids.shape[1] > self.max_length:
            row = int(np.argmax(lengths > self.max_length))
            raise DataError(
                f"Tokenize: row {row} of {where} has {int(lengths[row])} tokens, more than "
                f"max_length={self.max_length} (text starts {texts[row].as_py()[:60]!r}). Fix: "
                "truncation=True, a larger max_length, or pad=False."
            )
        if self.pad:
            id_array, mask_array = tensor_array(ids), tensor_array(mask.astype(np.int8))
        else:
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            id_array = pa.ListArray.from_arrays(offsets, pa.array(ids[mask]))
            mask_array = pa.ListArray.from_arrays(offsets, pa.array(mask[mask].astype(np.int8)))
        return self._assemble(batch, index, id_array, mask_array)

    def _assemble(
        self, batch: pa.RecordBatch, index: int, ids: pa.Array, mask: pa.Array
    ) -> pa.RecordBatch:
        """Replace the input column by the ids (or add them), put the mask right after."""
        fields, arrays = list(batch.schema), list(batch.columns)
        out, mask_name = self.output
        for name, array, at in ((out, ids, None), (mask_name, mask, index + 1)):
            names = [f.name for f in fields]
            if name in names:
                fields[names.index(name)] = pa.field(name, array.type)
                arrays[names.index(name)] = array
            else:
                at = at if at is not None and out == self.column else len(fields)
                fields.insert(at, pa.field(name, array.type))
                arrays.insert(at, array)
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, batch.schema.metadata))

    # ------------------------------------------------------------------ state

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "column": self.column,
            "tokenizer": self.source,
            "max_length": self.max_length,
            "pad": self.pad,
            "add_special_tokens": self.add_special_tokens,
            "truncation": self.truncation,
            "output": self.output[0],
            "mask_output": self.output[1],
            "pad_id": self.pad_id,
            "on_null": self.on_null,
            "sha256": self.sha256,
        }
        if self.tokenizer_json is not None:
            params["tokenizer_json"] = self.tokenizer_json
        if self.clip_options is not None:
            params["clip_options"] = self.clip_options
        return params

    @classmethod
    def _from_state(cls, state: dict[str, Any]) -> Tokenize:
        try:
            params = dict(state["params"])
            text = params.pop("tokenizer_json", None)
            clip = params.pop("clip_options", None)
            if text is not None:
                params["tokenizer"] = _tokenizers().Tokenizer.from_str(text)
            elif clip is not None:  # a ClipTokenizer instance with its own options
                path = params["tokenizer"][5:]
                params["tokenizer"] = ClipTokenizer(path, sha256=params["sha256"], **clip)
            return cls(**params)
        except FeedlineError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(
                f"Cannot rebuild Tokenize from its saved state: {exc}. Fix: pass the dict that "
                "Tokenize.state produced (re-fit and save it again if it was edited)."
            ) from exc

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_backend"] = state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __copy__(self) -> Tokenize:  # a copy shares the loaded tokenizer
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, _lock=threading.Lock())
        return new
