"""The column of each WebDataset field: its Arrow type and how a member's bytes become a value.

A field is what follows the first dot of a member's basename (``000123.jpg`` → ``jpg``,
``000123.seg.png`` → ``seg.png``), lower-cased as WebDataset does. Its default type comes from
its last extension, following WebDataset's own basic decoders:

======================================  ===========================================
extension                               column
======================================  ===========================================
``cls`` ``cls2`` ``index`` ``inx`` ``id``  ``int64`` (the ASCII number)
``txt`` ``text`` ``transcript``         ``string`` (UTF-8)
``json`` ``jsn``                        ``string``: the JSON text, checked to parse
images (``jpg`` ``png`` ``webp``…)       ``binary``: still encoded, decoded by the loader
anything else (``npy``, ``pyd``…)        ``binary``: the member's bytes, never unpickled
======================================  ===========================================

JSON stays text by default because its shape is free: an Arrow struct inferred from some
samples could refuse later ones. Give the type to get it parsed,
``fields={"json": pa.struct([("w", pa.int64())])}``; a nested type (struct, list, map) on
any field means "parse the member as JSON into it".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from feedline.errors import ConfigurationError

__all__ = ["converter", "default_type", "extension_of", "resolve_fields"]

_INT = frozenset({"cls", "cls2", "index", "inx", "id"})
_TEXT = frozenset({"txt", "text", "transcript"})
_JSON = frozenset({"json", "jsn"})
_ALIASES: dict[str, pa.DataType] = {
    "binary": pa.binary(),
    "bytes": pa.binary(),
    "string": pa.string(),
    "str": pa.string(),
    "int64": pa.int64(),
    "int": pa.int64(),
    "int32": pa.int32(),
    "float64": pa.float64(),
    "float": pa.float64(),
    "float32": pa.float32(),
}

#: turns a member's bytes into a value; raises ValueError when it cannot
Converter = Callable[[bytes], Any]


def extension_of(field: str) -> str:
    """The last extension of a field name (what decides its default type).

    Examples
    --------
    >>> extension_of("seg.png"), extension_of("cls")
    ('png', 'cls')
    """
    return field.rsplit(".", 1)[-1]


def default_type(field: str) -> pa.DataType:
    """The Arrow type a field gets when none is given.

    Examples
    --------
    >>> default_type("cls"), default_type("txt"), default_type("jpg"), default_type("json")
    (DataType(int64), DataType(string), DataType(binary), DataType(string))
    """
    ext = extension_of(field)
    if ext in _INT:
        return pa.int64()
    if ext in _TEXT or ext in _JSON:
        return pa.string()
    return pa.binary()


def resolve_fields(
    fields: Sequence[str] | Mapping[str, Any] | None, found: Sequence[str] = ()
) -> dict[str, pa.DataType]:
    """The fields to read and their Arrow types, in column order.

    Parameters
    ----------
    fields:
        ``None``: the ``found`` fields with their default types; a list of field names: those,
        with default types; a mapping field → type (a ``pa.DataType`` or one of ``"binary"``,
        ``"string"``, ``"int64"``, ``"int32"``, ``"float64"``, ``"float32"``; ``None`` keeps
        the default).
    found:
        The fields seen in the shards (used when ``fields`` is ``None``).

    Examples
    --------
    >>> resolve_fields(None, ["jpg", "cls"])
    {'jpg': DataType(binary), 'cls': DataType(int64)}
    >>> resolve_fields({"cls": "string", "jpg": None})
    {'cls': DataType(string), 'jpg': DataType(binary)}
    """
    if fields is None:
        return {name: default_type(name) for name in found}
    if isinstance(fields, str):
        fields = [fields]
    if not isinstance(fields, Mapping):
        fields = dict.fromkeys(fields)
    resolved: dict[str, pa.DataType] = {}
    for name, kind in fields.items():
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise ConfigurationError(
                f"fields= names {name!r}, which is not a WebDataset field. Fix: name fields "
                "by their extension without the dot, such as 'jpg', 'cls' or 'seg.png'."
            )
        resolved[name.lower()] = _type_of(name, kind)
    return resolved


def _type_of(name: str, kind: Any) -> pa.DataType:
    if kind is None:
        return default_type(name)
    if isinstance(kind, str) and kind.lower() in _ALIASES:
        return _ALIASES[kind.lower()]
    if isinstance(kind, pa.DataType) and _supported(kind):
        return kind
    raise ConfigurationError(
        f"fields={{{name!r}: {kind!r}}} is not a type a WebDataset field can be read as. "
        f"Fix: use a pyarrow type (binary, string, an integer or float type, or a struct/list "
        f"parsed from JSON) or one of {sorted(_ALIASES)}."
    )


def _supported(kind: pa.DataType) -> bool:
    t = pa.types
    return (
        t.is_binary(kind) or t.is_large_binary(kind) or t.is_string(kind)
        or t.is_large_string(kind) or t.is_integer(kind) or t.is_floating(kind)
        or t.is_boolean(kind) or _nested(kind)
    )  # fmt: skip


def _nested(kind: pa.DataType) -> bool:
    t = pa.types
    return t.is_struct(kind) or t.is_list(kind) or t.is_large_list(kind) or t.is_map(kind)


def converter(field: str, kind: pa.DataType) -> Converter:
    """The function turning a member's bytes into the column's value (``ValueError`` when not).

    Examples
    --------
    >>> converter("cls", pa.int64())(b" 7\\n")
    7
    >>> converter("json", pa.string())(b'{"a": 1}')
    '{"a": 1}'
    >>> converter("json", pa.struct([("a", pa.int64())]))(b'{"a": 1}')
    {'a': 1}
    >>> converter("txt", pa.string())(b"\\xff")
    Traceback (most recent call last):
    ...
    UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 0: ...
    """
    t = pa.types
    if t.is_binary(kind) or t.is_large_binary(kind):
        return bytes
    if _nested(kind):
        return _json_into(kind)
    if t.is_string(kind) or t.is_large_string(kind):
        return _json_text if extension_of(field) in _JSON else _text
    if t.is_integer(kind):
        return _integer(kind)
    if t.is_floating(kind):
        return lambda data: float(_text(data))
    return _boolean


def _text(data: bytes) -> str:
    return data.decode("utf-8")  # UnicodeDecodeError is a ValueError


def _json_text(data: bytes) -> str:
    text = _text(data)
    json.loads(text)  # checked here, so a bad member is found at read time (JSONDecodeError)
    return text


def _integer(kind: pa.DataType) -> Converter:
    info_bits = kind.bit_width
    signed = pa.types.is_signed_integer(kind)
    low = -(1 << (info_bits - 1)) if signed else 0
    high = (1 << (info_bits - 1 if signed else info_bits)) - 1

    def parse(data: bytes) -> int:
        value = int(_text(data))
        if not low <= value <= high:
            raise ValueError(f"{value} does not fit in {kind}")
        return value

    return parse


def _boolean(data: bytes) -> bool:
    text = _text(data).strip().lower()
    if text in ("1", "true", "yes"):
        return True
    if text in ("0", "false", "no"):
        return False
    raise ValueError(f"{text[:40]!r} is not a boolean (1/0, true/false, yes/no)")


def _json_into(kind: pa.DataType) -> Converter:
    def parse(data: bytes) -> Any:
        value = json.loads(_text(data))
        try:
            pa.array([value], kind)  # the value must fit the type; the batch is built later
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(f"the JSON does not fit {kind}: {exc}") from exc
        return value

    return parse
