"""The manifest of a feedline dataset (``_feedline.json``): what it holds and how it is checked.

A manifest is untrusted input: it may come from anyone's bucket. Parsing it never runs
code (plain JSON, an Arrow IPC schema, no pickle), and every field is checked for type
and range before anything else uses it, so a hostile or damaged manifest raises
:class:`~feedline.errors.FormatError` (never another exception type):

- the file is at most :data:`MAX_MANIFEST_BYTES`; JSON nesting deeper than Python's
  recursion limit, ``NaN``/``Infinity`` and integers of thousands of digits are refused;
- counts are real integers (not floats, strings or booleans) in ``[0, 2**53]``; a shard's
  row groups add up to its rows and there are no more of them than the shard has bytes;
- shard paths are plain relative paths inside the dataset folder: no ``..``, no absolute
  or drive paths, no URLs, no backslashes, control characters or empty segments, no
  duplicates;
- checksums are ``sha256:<64 hex digits>`` (or empty for plain Parquet files).

A dataset of many shards (more than :data:`COMPACT_SHARDS`) gets a compact manifest, format
version 2: the same document, with the shard list stored as one table instead of one JSON
object per shard, ``"shard_table": {"columns": ["path", "rows", ...], "rows": [[...], ...]}``
(the column names written out, one shard per line), about half the bytes of version 1 and
still one request to read. Its rows go through the same checks as version-1 entries. A
dataset of fewer shards keeps version 1, which every feedline reads; a feedline older than
version 2 refuses a compact manifest with a message to upgrade.

A shard entry also records what protects the shard when it is read (both absent in
datasets written before feedline recorded them, which still open): ``footer``, the
sha256 of the shard's Parquet footer bytes (checked whenever feedline reads a footer:
:mod:`feedline.store.footers`), and ``page_checksums``, whether its pages carry CRC-32
checksums (verified on every read). Older feedline versions ignore both fields.
"""

from __future__ import annotations

import base64
import builtins
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TypeGuard

import pyarrow as pa

from feedline._version import __version__
from feedline.arrow.column_names import repeated
from feedline.arrow.pandas_metadata import valid_pandas_schema
from feedline.errors import FormatError

__all__ = [
    "COMPACT_SHARDS",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "Manifest",
    "ShardInfo",
    "schema_from_json",
    "schema_to_json",
]

#: the newest manifest format this feedline reads and writes (2: the compact shard table)
FORMAT_VERSION = 2
#: a manifest of more shards than this is written in the compact format (version 2)
COMPACT_SHARDS = 1024
#: the columns of a compact manifest's shard table, in the order they are written
SHARD_COLUMNS = ("path", "rows", "bytes", "row_groups", "checksum", "footer", "page_checksums")
MANIFEST_NAME = "_feedline.json"
MAX_MANIFEST_BYTES = 64 << 20
#: the largest count (rows, bytes) a manifest may state: exact in a float64, far above any
#: real dataset
MAX_COUNT = 2**53
_MAX_PATH_CHARS = 1024
_CHECKSUM = re.compile(r"sha256:[0-9a-f]{64}")
_REWRITE = "Fix: re-run the write that produced this dataset."


@dataclass(frozen=True)
class ShardInfo:
    """One shard of a dataset, as recorded in the manifest."""

    path: str
    rows: int
    bytes: int
    row_groups: tuple[int, ...]
    checksum: str
    #: ``sha256:<hex>`` of the Parquet footer bytes (metadata, its length and ``PAR1``), or
    #: ``""`` when not recorded (older datasets, plain Parquet files)
    footer: str = ""
    #: whether the shard's pages carry CRC-32 checksums (``write_page_checksum``)
    page_checksums: bool = False


@dataclass
class Manifest:
    """The committed description of a feedline dataset (``_feedline.json``).

    Examples
    --------
    >>> import pyarrow as pa
    >>> shard = ShardInfo("part-00000.parquet", 3, 10, (3,), "")
    >>> m = Manifest(pa.schema({"x": pa.int64()}), [shard])
    >>> back = Manifest.from_json(m.to_json(), "example")
    >>> (back.rows, back.shards[0].path, back.schema.names)
    (3, 'part-00000.parquet', ['x'])
    """

    schema: pa.Schema
    shards: list[ShardInfo]
    lineage: dict[str, Any] = field(default_factory=dict)
    preprocessors: list[dict[str, Any]] = field(default_factory=list)
    statistics: dict[str, Any] = field(default_factory=dict)
    write: dict[str, Any] = field(default_factory=dict)
    #: the format version read (1 or 2); :meth:`to_json` writes 2 only for a compact manifest
    format_version: int = 1
    created: str = ""
    #: this commit as a version of the dataset: ``{"id", "time", "operation", "parent"}``
    #: (:mod:`feedline.store.version_files`); empty in datasets written before versions
    #: (which are version 1)
    version: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Every writer's manifest (and an old one read back) holds pandas metadata true to
        # its columns: stale entries would break to_pandas() of the dataset.
        self.schema = valid_pandas_schema(self.schema)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def version_id(self) -> int:
        """The dataset version this manifest is (1 for a dataset written before versions)."""
        return int(self.version.get("id", 1))

    @property
    def row_group_sizes(self) -> list[int]:
        """Rows of every row group, shard after shard (the loader's unit of reading)."""
        return [n for shard in self.shards for n in shard.row_groups]

    def to_json(self) -> str:
        """The manifest as JSON text: format version 1, or for more than
        :data:`COMPACT_SHARDS` shards the compact version 2 (one table row per shard).

        Examples
        --------
        >>> shards = [ShardInfo(f"p{i}.parquet", 1, 10, (1,), "") for i in range(1025)]
        >>> text = Manifest(pa.schema({"x": pa.int64()}), shards).to_json()
        >>> doc = json.loads(text)
        >>> doc["format_version"], doc["shard_table"]["rows"][0]
        (2, ['p0.parquet', 1, 10, [1], '', '', False])
        >>> Manifest.from_json(text, "example").shards == shards
        True
        """
        compact = len(self.shards) > COMPACT_SHARDS
        document = {
            "format": "feedline",
            "format_version": 2 if compact else 1,
            "feedline_version": __version__,
            "created": self.created or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "rows": self.rows,
            "bytes": self.bytes,
            "schema": schema_to_json(self.schema),
            "shards": [asdict(s) | {"row_groups": list(s.row_groups)} for s in self.shards],
            "preprocessors": self.preprocessors,
            "statistics": self.statistics,
            "lineage": self.lineage,
            "write": self.write,
        }
        if self.version:
            document["version"] = self.version
        if not compact:
            return json.dumps(document, indent=1, allow_nan=False, default=_json_default)
        del document["shards"]
        document["shard_table"] = {"columns": list(SHARD_COLUMNS), "rows": _HOLE}
        text = json.dumps(document, indent=1, allow_nan=False, default=_json_default)
        rows = ",\n".join(_table_row(s) for s in self.shards)
        return text.replace(json.dumps(_HOLE), "[\n" + rows + "\n  ]", 1)

    @classmethod
    def from_json(cls, text: str | builtins.bytes, where: str) -> Manifest:
        """Parse and validate manifest text; raises :class:`FormatError` naming ``where``."""
        if len(text) > MAX_MANIFEST_BYTES:
            raise FormatError(
                f"The manifest {where} is {len(text)} bytes, over the {MAX_MANIFEST_BYTES}-byte "
                f"limit. {_REWRITE}"
            )
        try:
            doc = json.loads(text, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            raise FormatError(
                f"The manifest {where} is not valid JSON: {reason}. {_REWRITE}"
            ) from None
        if not isinstance(doc, dict) or doc.get("format") != "feedline":
            raise FormatError(f"{where} is not a feedline manifest. {_REWRITE}")
        version = doc.get("format_version")
        if (
            not isinstance(version, int)
            or isinstance(version, bool)
            or not 1 <= version <= FORMAT_VERSION
        ):
            raise FormatError(
                f"{where} has format version {_short(version)}; this feedline reads versions 1 "
                f"to {FORMAT_VERSION}. Fix: upgrade feedline or rewrite the dataset."
            )
        shards = _shard_table(doc, where) if version >= 2 else doc.get("shards")
        if not isinstance(shards, list):
            raise FormatError(f"The manifest {where} has no list of shards. {_REWRITE}")
        parsed = [_shard_from(entry, where) for entry in shards]
        paths = [s.path for s in parsed]
        if len(set(paths)) != len(paths):
            raise FormatError(f"The manifest {where} names a shard twice. {_REWRITE}")
        manifest = cls(
            schema=schema_from_json(doc.get("schema"), where),
            shards=parsed,
            lineage=_typed(doc, "lineage", dict, where),
            preprocessors=_typed(doc, "preprocessors", list, where),
            statistics=_typed(doc, "statistics", dict, where),
            write=_typed(doc, "write", dict, where),
            format_version=version,
            created=str(_typed(doc, "created", str, where) or ""),
            version=_version_from(doc, where),
        )
        if not all(isinstance(p, dict) for p in manifest.preprocessors):
            raise FormatError(f"The manifest {where} has a malformed preprocessor. {_REWRITE}")
        rows = doc.get("rows")
        if rows is not None and (not _is_count(rows) or rows != manifest.rows):
            raise FormatError(
                f"The manifest {where} says {_short(rows)} rows but its shards add up to "
                f"{manifest.rows}. {_REWRITE}"
            )
        return manifest


#: a placeholder the compact shard table's rows replace in the JSON text (one line each)
_HOLE = "\u0000feedline-shard-rows\u0000"


def _table_row(shard: ShardInfo) -> str:
    """One shard as a row of the compact shard table (values in :data:`SHARD_COLUMNS` order)."""
    values = [shard.path, shard.rows, shard.bytes, list(shard.row_groups), shard.checksum,
              shard.footer, shard.page_checksums]  # fmt: skip
    return json.dumps(values, separators=(",", ":"), allow_nan=False, default=_json_default)


def _shard_table(doc: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The shard entries of a compact (version 2) manifest, as version-1 objects: the table's
    rows matched to its columns. A malformed table raises :class:`FormatError`."""
    table = doc.get("shard_table")
    columns = table.get("columns") if isinstance(table, dict) else None
    rows = table.get("rows") if isinstance(table, dict) else None
    if (
        "shards" in doc
        or not isinstance(columns, list)
        or not isinstance(rows, list)
        or not all(isinstance(c, str) for c in columns)
        or len(set(columns)) != len(columns)
        or not {"path", "rows", "bytes", "row_groups", "checksum"} <= set(columns)
        or not set(columns) <= set(SHARD_COLUMNS)
    ):
        raise FormatError(
            f"The manifest {where} (format version 2) has no readable 'shard_table' (expected "
            f"'columns' naming {list(SHARD_COLUMNS)} and 'rows', one list per shard, and no "
            f"'shards'). {_REWRITE}"
        )
    entries = []
    for index, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(columns):
            raise FormatError(
                f"The manifest {where} has a malformed row {index} in its shard table "
                f"({_short(row)}; expected {len(columns)} values: {columns}). {_REWRITE}"
            )
        entries.append(dict(zip(columns, row, strict=True)))
    return entries


def _version_from(doc: dict[str, Any], where: str) -> dict[str, Any]:
    """The ``version`` entry, checked: a positive id, a time and an operation (strings)."""
    version = _typed(doc, "version", dict, where)
    if not version:
        return {}
    number, parent = version.get("id"), version.get("parent")
    if not (
        _is_count(number)
        and number >= 1
        and isinstance(version.get("time"), str)
        and len(version["time"]) <= 64
        and isinstance(version.get("operation"), str)
        and len(version["operation"]) <= 64
        and (parent is None or (_is_count(parent) and parent < number))
    ):
        raise FormatError(
            f"The manifest {where} has a malformed 'version' entry {_short(version)} "
            f"(expected an id >= 1, a time, an operation and an older parent). {_REWRITE}"
        )
    return {"id": number, "time": version["time"], "operation": version["operation"],
            "parent": parent}  # fmt: skip


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _typed(doc: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = doc.get(key)
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise FormatError(
            f"The manifest {where} has a {type(value).__name__} for {key!r}, not a "
            f"{kind.__name__}. {_REWRITE}"
        )
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def check_shard_path(path: Any, where: str) -> str:
    """``path`` when it is a plain relative path inside the dataset folder, else FormatError.

    Examples
    --------
    >>> check_shard_path("part-00000-0a1b2c3d4e5f.parquet", "m")
    'part-00000-0a1b2c3d4e5f.parquet'
    >>> check_shard_path("../x.parquet", "m")
    Traceback (most recent call last):
    ...
    feedline.errors.FormatError: The manifest m names the shard path '../x.parquet', ...
    """
    parts = path.split("/") if isinstance(path, str) else []
    if (
        not parts
        or len(path) > _MAX_PATH_CHARS
        or any(part in ("", ".", "..") for part in parts)
        or any(ch in path for ch in ":\\")
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in path)
    ):
        raise FormatError(
            f"The manifest {where} names the shard path {_short(path)}, which is not a plain "
            f"relative path inside the dataset folder. {_REWRITE}"
        )
    return path


def _shard_from(entry: Any, where: str) -> ShardInfo:
    if not isinstance(entry, dict):
        raise FormatError(
            f"The manifest {where} has a shard entry that is not an object. {_REWRITE}"
        )
    path = check_shard_path(entry.get("path"), where)
    rows, size, groups = entry.get("rows"), entry.get("bytes"), entry.get("row_groups")
    checksum, footer = entry.get("checksum"), entry.get("footer", "")
    page_checksums = entry.get("page_checksums", False)
    if not (
        _is_count(rows)
        and _is_count(size)
        and isinstance(groups, list)
        and len(groups) <= max(size, 1)
        and all(_is_count(n) for n in groups)
        and sum(groups) == rows
    ):
        raise FormatError(
            f"The manifest {where} has missing, mistyped or inconsistent sizes for the shard "
            f"{path!r} (rows {_short(rows)}, bytes {_short(size)}, row_groups "
            f"{_short(groups)}). {_REWRITE}"
        )
    if not isinstance(checksum, str) or not (checksum == "" or _CHECKSUM.fullmatch(checksum)):
        raise FormatError(
            f"The manifest {where} has the checksum {_short(checksum)} for the shard {path!r}; "
            f"expected 'sha256:' and 64 hex digits. {_REWRITE}"
        )
    if not isinstance(footer, str) or not (footer == "" or _CHECKSUM.fullmatch(footer)):
        raise FormatError(
            f"The manifest {where} has the footer checksum {_short(footer)} for the shard "
            f"{path!r}; expected 'sha256:' and 64 hex digits. {_REWRITE}"
        )
    if not isinstance(page_checksums, bool):
        raise FormatError(
            f"The manifest {where} has {_short(page_checksums)} for 'page_checksums' of the "
            f"shard {path!r}; expected true or false. {_REWRITE}"
        )
    return ShardInfo(path, rows, size, tuple(groups), checksum, footer, page_checksums)


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A schema as JSON: readable fields plus the exact Arrow IPC encoding (base64).

    Examples
    --------
    >>> doc = schema_to_json(pa.schema({"x": pa.int32()}))
    >>> doc["fields"]
    [{'name': 'x', 'type': 'int32', 'nullable': True}]
    >>> schema_from_json(doc, "example").names
    ['x']
    """
    return {
        "fields": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in schema],
        "arrow_ipc": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
    }


def schema_from_json(doc: Any, where: str) -> pa.Schema:
    """Inverse of :func:`schema_to_json`; raises :class:`FormatError` naming ``where``."""
    encoded = doc.get("arrow_ipc") if isinstance(doc, dict) else None
    if not isinstance(encoded, str):
        raise FormatError(f"The manifest {where} has no Arrow schema (arrow_ipc). {_REWRITE}")
    try:
        raw = base64.b64decode(encoded, validate=True)
        schema = pa.ipc.read_schema(pa.py_buffer(raw))
        str(schema)  # every type must also be printable (names in messages)
    except (ValueError, TypeError, OSError, pa.ArrowException) as exc:
        raise FormatError(
            f"The schema in {where} cannot be decoded: {str(exc)[:200]}. {_REWRITE}"
        ) from None
    twice = repeated(schema.names)
    if twice:
        raise FormatError(
            f"The schema in {where} names more than one column {twice[:10]}, so its shards "
            "cannot be read back (a reader cannot tell the columns apart). Fix: re-run the "
            "write with one name per column (feedline versions that check this refuse such a "
            "write)."
        )
    return schema
