"""Reading a Petastorm Unischema from its pickle without unpickling it.

Petastorm stores the dataset's ``Unischema`` as ``pickle.dumps(schema)`` under the key
``dataset-toolkit.unischema.v1`` of ``_common_metadata``. Unpickling runs whatever the
pickle names, so feedline never does: :func:`parse_unischema` walks the opcodes
(:func:`pickletools.genops` parses; nothing executes) with a small stack machine whose only
"objects" are inert records of a class name, its arguments and its state. Every global the
pickle names must be on an allow-list (Petastorm's ``Unischema``, ``UnischemaField`` and four
codecs, NumPy scalar types, Spark SQL types, ``OrderedDict``, ``copyreg._reconstructor``,
``decimal.Decimal``), and every opcode must be one a plain Unischema pickle uses (protocols
0 to 5); anything else raises :class:`~feedline.errors.FormatError` before any value is
used. The walk is bounded: at most :data:`MAX_OPCODES` opcodes and :data:`MAX_WORK` values
copied (a pickle can reuse one memoised list many times: a "memo bomb" of a few KiB describes
a structure of 2**400 elements, which is never expanded; messages show values through a
bounded ``reprlib``), and dict keys must be plain scalars (hashing a shared nested tuple is
exponential work). A shape must be positive ints or ``None``, its fixed dimensions holding at
most 2**31 - 1 elements (what an Arrow column value can). What is read: per field its name,
NumPy dtype, shape (``None`` for a variable dimension), codec class name and codec arguments
(``image_codec`` ``"png"``/``"jpeg"``, ``quality``, the Spark type's class name), and
``nullable``.

Examples
--------
>>> import pickle
>>> parse_unischema(pickle.dumps({"not": "a unischema"}))
Traceback (most recent call last):
...
feedline.errors.FormatError: The Petastorm schema pickle holds a dict, not a Unischema...
"""

from __future__ import annotations

import math
import pickletools
import re
import reprlib
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from feedline.errors import FormatError

__all__ = ["UNISCHEMA_KEY", "PetastormField", "Unischema", "parse_unischema"]

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
#: the largest schema pickle read (a Unischema of thousands of fields is ~1 MB)
MAX_PICKLE_BYTES = 16 << 20
#: the most opcodes walked (a Unischema pickle takes about 20 per field)
MAX_OPCODES = 1_000_000
#: the most values the walk may copy in all (items appended, set, or reused from the memo)
MAX_WORK = 4_000_000
#: the most elements a field's fixed dimensions may hold (an Arrow fixed-size list's bound)
MAX_FIELD_ELEMENTS = 2**31 - 1
_MAX_DEPTH = 64
_MAX_DIMS = 32
_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxtuple, _SHOW.maxdict = 3, 4, 4, 4
_SHOW.maxstring, _SHOW.maxlong, _SHOW.maxother = 40, 40, 40

CODECS = ("NdarrayCodec", "CompressedNdarrayCodec", "CompressedImageCodec", "ScalarCodec")
_NUMPY_TYPES = {
    "bool_": "bool",
    "bool": "bool",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "float32": "float32",
    "float64": "float64",
    "half": "float16",
    "single": "float32",
    "double": "float64",
    "float_": "float64",
    "int_": "int64",
    "intc": "int32",
    "uintc": "uint32",
    "longlong": "int64",
    "ulonglong": "uint64",
    "byte": "int8",
    "ubyte": "uint8",
    "short": "int16",
    "ushort": "uint16",
    "str_": "U",
    "unicode_": "U",
    "bytes_": "S",
    "string_": "S",
}
_ALLOWED = {
    "petastorm.unischema": {"Unischema", "UnischemaField"},
    "petastorm.codecs": set(CODECS),
    "numpy": set(_NUMPY_TYPES) | {"dtype"},
    "collections": {"OrderedDict"},
    "copyreg": {"_reconstructor"},
    "copy_reg": {"_reconstructor"},
    "builtins": {"object", "tuple", "str", "bytes", "int", "float", "bool"},
    "__builtin__": {"object", "tuple", "str", "unicode", "bytes", "int", "long", "float", "bool"},
    "decimal": {"Decimal"},
}
_SPARK_TYPES = "pyspark.sql.types"
_BUILTIN_DTYPES = {
    "str": "U",
    "unicode": "U",
    "bytes": "S",
    "int": "int64",
    "long": "int64",
    "float": "float64",
    "bool": "bool",
}
_DTYPE_CODE = re.compile(r"^[<>|=]?[biufSU]\d{0,3}$")


@dataclass(frozen=True)
class PetastormField:
    """One Unischema field, as read from the pickle.

    ``dtype`` is a NumPy dtype, or ``None`` for ``decimal.Decimal``; ``shape`` holds ints
    and ``None`` (a variable dimension); ``codec`` is the codec's class name or ``None``;
    ``codec_args`` its arguments (``image_codec``, ``quality``, ``spark_type``).
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[int | None, ...]
    codec: str | None
    codec_args: dict[str, Any] = field(default_factory=dict)
    nullable: bool = False


@dataclass(frozen=True)
class Unischema:
    """A Petastorm schema: its name and fields in order."""

    name: str
    fields: tuple[PetastormField, ...]

    def field(self, name: str) -> PetastormField | None:
        """The field called ``name``, or ``None``."""
        return next((f for f in self.fields if f.name == name), None)


class _Global:
    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __repr__(self) -> str:
        return f"{self.module}.{self.name}"


class _Obj:
    """An object the pickle would build: a class, its arguments, its state (inert)."""

    __slots__ = ("args", "cls", "state")

    def __init__(self, cls: _Global, args: tuple, state: Any = None) -> None:
        self.cls, self.args, self.state = cls, args, state


class _Mark:
    pass


def _show(value: Any) -> str:
    """A bounded text of a value from the pickle (never its full ``str``: it may be a bomb)."""
    return _SHOW.repr(value)


def _refuse(reason: str) -> FormatError:
    return FormatError(
        f"The Petastorm schema pickle was refused: {reason}. It was not unpickled. Fix: if the "
        "dataset is yours, re-write its metadata with Petastorm; feedline otherwise reads the "
        "Parquet schema and detects each binary column's codec from its bytes."
    )


def _check_global(module: str, name: str) -> _Global:
    if not isinstance(module, str) or not isinstance(name, str):
        raise _refuse("a global is not named by strings")
    if name in _ALLOWED.get(module, ()):
        return _Global(module, name)
    if module == _SPARK_TYPES and re.fullmatch(r"[A-Z][A-Za-z]*Type", name):
        return _Global(module, name)
    raise _refuse(f"it names {module[:100]}.{name[:100]}, which a Unischema never holds")


def _walk(data: bytes) -> Any:
    """The value the pickle describes, with objects as inert :class:`_Obj` records."""
    machine = _Machine()
    try:
        with warnings.catch_warnings():  # protocol 0 strings with odd escapes: refused below
            warnings.simplefilter("ignore", DeprecationWarning)
            for count, (op, arg, _) in enumerate(pickletools.genops(data)):
                if count >= MAX_OPCODES:
                    raise _refuse(f"it holds more than {MAX_OPCODES:,} opcodes")
                if not machine.step(op.name, arg):
                    break
    except (ValueError, EOFError, UnicodeDecodeError) as exc:
        raise _refuse(f"it is not a valid pickle ({_show(str(exc))})") from None
    except (TypeError, RecursionError, IndexError) as exc:
        raise _refuse(f"its opcodes do not describe plain values ({type(exc).__name__})") from None
    if len(machine.stack) != 1:
        raise _refuse("it does not end with exactly one value")
    return machine.stack[0]


class _Machine:
    """The pickle virtual machine's stack, marks and memo, holding inert values only."""

    def __init__(self) -> None:
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.work = 0

    def spend(self, items: int) -> None:
        """Count ``items`` values copied; refuse past :data:`MAX_WORK`."""
        self.work += items
        if self.work > MAX_WORK:
            raise _refuse(f"it describes more than {MAX_WORK:,} values, far more than a Unischema")

    def pop(self) -> Any:
        if not self.stack:
            raise _refuse("an opcode pops an empty stack")
        return self.stack.pop()

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise _refuse("an opcode needs a mark that is not there")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    def step(self, name: str, arg: Any) -> bool:
        """Apply one opcode; ``False`` at ``STOP``."""
        if name in ("PROTO", "FRAME"):
            return True
        if name == "STOP":
            return False
        if name == "MARK":
            self.marks.append(len(self.stack))
        elif name == "POP":
            self.pop()
        elif name == "POP_MARK":
            self.pop_mark()
        elif name == "DUP":
            self.stack.append(self.stack[-1] if self.stack else self.pop())
        elif name in ("NONE", "NEWTRUE", "NEWFALSE"):
            self.stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
        elif name in (
            "INT",
            "BININT",
            "BININT1",
            "BININT2",
            "LONG",
            "LONG1",
            "LONG4",
            "FLOAT",
            "BINFLOAT",
            "STRING",
            "BINSTRING",
            "SHORT_BINSTRING",
            "UNICODE",
            "BINUNICODE",
            "SHORT_BINUNICODE",
            "BINUNICODE8",
            "BINBYTES",
            "SHORT_BINBYTES",
            "BINBYTES8",
        ):
            self.stack.append(arg)
        elif name == "EMPTY_TUPLE":
            self.stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            count = int(name[-1])
            if len(self.stack) < count:
                raise _refuse("a tuple opcode pops an empty stack")
            items = tuple(self.stack[-count:])
            del self.stack[-count:]
            self.stack.append(items)
        elif name == "TUPLE":
            self.stack.append(tuple(self.pop_mark()))
        elif name == "EMPTY_LIST":
            self.stack.append([])
        elif name == "LIST":
            self.stack.append(self.pop_mark())
        elif name in ("APPEND", "APPENDS"):
            appended = [self.pop()] if name == "APPEND" else self.pop_mark()
            target = self.stack[-1] if self.stack else None
            if not isinstance(target, list):
                raise _refuse("it appends to something that is not a list")
            self.spend(len(appended))
            target.extend(appended)
        elif name == "EMPTY_DICT":
            self.stack.append({})
        elif name in ("DICT", "SETITEM", "SETITEMS"):
            if name == "SETITEM":
                value, key = self.pop(), self.pop()
                pairs = [key, value]
            else:
                pairs = self.pop_mark()
            if len(pairs) % 2:
                raise _refuse("a dict opcode has an odd number of items")
            target = {} if name == "DICT" else (self.stack[-1] if self.stack else None)
            if not isinstance(target, dict):
                raise _refuse("it sets items on something that is not a dict")
            self.spend(len(pairs))
            for key, value in zip(pairs[::2], pairs[1::2], strict=True):
                if not isinstance(key, str | int | bytes | type(None)):  # never hash a tuple
                    raise _refuse("a dict key is not a plain value")
                target[key] = value
            if name == "DICT":
                self.stack.append(target)
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            self.stack.append(_check_global(module, attr))
        elif name == "STACK_GLOBAL":
            attr, module = self.pop(), self.pop()
            self.stack.append(_check_global(module, attr))
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            self.memo[int(arg)] = self.stack[-1] if self.stack else self.pop()
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = self.stack[-1] if self.stack else self.pop()
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg) not in self.memo:
                raise _refuse("it reads a memo entry that was never written")
            self.stack.append(self.memo[int(arg)])
        elif name in ("REDUCE", "NEWOBJ"):
            args, cls = self.pop(), self.pop()
            self.stack.append(_call(cls, args, self))
        elif name == "NEWOBJ_EX":
            kwargs, args, cls = self.pop(), self.pop(), self.pop()
            if kwargs:
                raise _refuse("it builds an object with keyword arguments")
            self.stack.append(_call(cls, args, self))
        elif name == "BUILD":
            state, target = self.pop(), (self.stack[-1] if self.stack else None)
            if not isinstance(target, _Obj):
                raise _refuse("it sets the state of something that is not an object")
            if isinstance(target.state, dict) and isinstance(state, dict):
                self.spend(len(state))
                target.state.update(state)
            else:
                target.state = state
        else:
            raise _refuse(f"it uses the opcode {name}, which a Unischema pickle never holds")
        if len(self.marks) > _MAX_DEPTH:
            raise _refuse("it nests deeper than a Unischema does")
        return True


def _call(cls: Any, args: Any, machine: _Machine) -> Any:
    """What ``cls(*args)`` would build, as inert data (never called)."""
    if not isinstance(cls, _Global) or not isinstance(args, tuple):
        raise _refuse("it calls something that is not an allowed class")
    key = (cls.module, cls.name)
    if key in (("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor")):
        if len(args) != 3 or not isinstance(args[0], _Global):
            raise _refuse("copyreg._reconstructor gets unexpected arguments")
        target, base, state = args
        _check_global(target.module, target.name)
        if isinstance(base, _Global) and base.name == "tuple" and isinstance(state, tuple):
            return _Obj(target, state)
        return _Obj(target, ())
    if key == ("collections", "OrderedDict"):
        pairs = args[0] if args else []
        machine.spend(len(pairs) if isinstance(pairs, list) else 0)
        if not isinstance(pairs, list) or not all(
            isinstance(p, list | tuple) and len(p) == 2 for p in pairs
        ):
            raise _refuse("an OrderedDict gets unexpected arguments")
        if not all(isinstance(p[0], str | int | bytes | type(None)) for p in pairs):
            raise _refuse("an OrderedDict key is not a plain value")
        return {k: v for k, v in pairs}
    if cls.module in ("builtins", "__builtin__") and cls.name == "object":
        return _Obj(cls, ())
    if cls.module in ("builtins", "__builtin__") or key == ("decimal", "Decimal"):
        raise _refuse(f"it calls {cls!r}, which a Unischema never does")
    return _Obj(cls, args)


def _dtype(value: Any, where: str) -> np.dtype | None:
    if isinstance(value, _Global):
        if value.module == "numpy" and value.name in _NUMPY_TYPES:
            return np.dtype(_NUMPY_TYPES[value.name])
        if value.module in ("builtins", "__builtin__") and value.name in _BUILTIN_DTYPES:
            return np.dtype(_BUILTIN_DTYPES[value.name])
        if (value.module, value.name) == ("decimal", "Decimal"):
            return None
    if isinstance(value, _Obj) and (value.cls.module, value.cls.name) == ("numpy", "dtype"):
        code = value.args[0] if value.args else None
        if isinstance(code, str) and _DTYPE_CODE.match(code):
            return np.dtype(code)
    raise _refuse(f"{where} has the numpy_dtype {_show(value)}, which is not a plain value type")


def _codec(value: Any, where: str) -> tuple[str | None, dict[str, Any]]:
    if value is None:
        return None, {}
    if not isinstance(value, _Obj) or value.cls.module != "petastorm.codecs":
        raise _refuse(f"{where} has the codec {_show(value)}, not one of Petastorm's")
    state = value.state if isinstance(value.state, dict) else {}
    args: dict[str, Any] = {}
    if value.cls.name == "CompressedImageCodec":
        named = state.get("_image_codec", ".png")
        codec = named.lstrip(".").lower() if isinstance(named, str) else ""
        if codec not in ("png", "jpeg", "jpg"):
            raise _refuse(f"{where} names the image codec {_show(named)} (png or jpeg expected)")
        quality = state.get("_quality", 80)
        args = {
            "image_codec": "jpeg" if codec == "jpg" else codec,
            "quality": quality if isinstance(quality, int) else None,
        }
    elif value.cls.name == "ScalarCodec":
        spark = state.get("_spark_type")
        args = {"spark_type": spark.cls.name if isinstance(spark, _Obj) else None}
    return value.cls.name, args


def _shape(value: Any, where: str) -> tuple[int | None, ...]:
    """The field's shape: at most 32 dimensions, each a positive int or ``None`` (variable),
    the fixed ones holding at most :data:`MAX_FIELD_ELEMENTS` elements together."""
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, tuple) or len(value) > _MAX_DIMS:
        raise _refuse(f"{where} has the shape {_show(value)}, not a tuple of up to 32 sizes")
    for dim in value:
        if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or dim < 1):
            raise _refuse(
                f"{where} has the shape {_show(value)}: a dimension must be a positive int or "
                "None (a variable size)"
            )
    elements = math.prod(d for d in value if d is not None)
    if elements > MAX_FIELD_ELEMENTS:
        raise _refuse(
            f"{where} has the shape {_show(value)}: {elements:,} elements per value, more than "
            f"the {MAX_FIELD_ELEMENTS:,} a column value may hold"
        )
    return value


def _field(value: Any) -> PetastormField:
    if not isinstance(value, _Obj) or value.cls.name != "UnischemaField":
        raise _refuse("a field of the schema is not a UnischemaField")
    args = value.args
    if len(args) < 3 or len(args) > 5 or not isinstance(args[0], str):
        raise _refuse("a UnischemaField does not hold (name, dtype, shape, codec, nullable)")
    name = args[0]
    where = f"the field {name[:80]!r}"
    codec, codec_args = _codec(args[3] if len(args) > 3 else None, where)
    nullable = args[4] if len(args) > 4 else False
    if not isinstance(nullable, bool | int | type(None)):
        raise _refuse(f"{where} has nullable={_show(nullable)}")
    return PetastormField(
        name, _dtype(args[1], where), _shape(args[2], where), codec, codec_args, bool(nullable)
    )


def parse_unischema(data: bytes) -> Unischema:
    """The Unischema described by ``data`` (a pickle), read without unpickling.

    Raises :class:`~feedline.errors.FormatError` for anything but a plain Unischema pickle.
    """
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) > MAX_PICKLE_BYTES:
        raise _refuse("it is not bytes, or larger than any Unischema")
    value = _walk(bytes(data))
    if not isinstance(value, _Obj) or (value.cls.module, value.cls.name) != (
        "petastorm.unischema",
        "Unischema",
    ):
        kind = type(value).__name__ if not isinstance(value, _Obj) else repr(value.cls)
        raise FormatError(
            f"The Petastorm schema pickle holds a {kind}, not a Unischema. It was not "
            "unpickled. Fix: point at a dataset written by Petastorm's materialize_dataset, or "
            "read the folder with fl.read_parquet."
        )
    state = value.state if isinstance(value.state, dict) else {}
    fields = state.get("_fields")
    if not isinstance(fields, dict) or not fields:
        raise _refuse("the Unischema has no _fields")
    parsed = tuple(_field(f) for f in fields.values())
    if [f.name for f in parsed] != list(fields):
        raise _refuse("the Unischema's field names do not match its fields")
    name = state.get("_name")
    return Unischema(name if isinstance(name, str) else "", parsed)
