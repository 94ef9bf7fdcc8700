"""The feedline exception tree.

Every failure feedline raises on purpose is a :class:`FeedlineError`. Its message says
*what* went wrong, *where* (file, shard, row group, row, function) and *how to fix it*.

::

    FeedlineError
    ├── ConfigurationError        bad arguments, unknown engine, missing optional extra
    │   └── MissingDependencyError   an optional package is not installed (names the pip extra)
    ├── SchemaError               missing columns, drift between files, wrong dtypes
    ├── DataError                 a record or file cannot be parsed or decoded
    ├── FormatError               the feedline dataset format is violated
    │   ├── IncompleteDatasetError   a write was interrupted: no manifest was committed
    │   └── IntegrityError           a checksum or row count does not match the manifest
    ├── ConcurrentWriteError      another write to the same dataset holds it or committed first
    ├── StorageError              a storage call failed for good (retries exhausted, denied, full)
    └── UserFunctionError         a user function raised; the original traceback is chained
"""

from __future__ import annotations

__all__ = [
    "ConcurrentWriteError",
    "ConfigurationError",
    "DataError",
    "FeedlineError",
    "FormatError",
    "IncompleteDatasetError",
    "IntegrityError",
    "MissingDependencyError",
    "SchemaError",
    "StorageError",
    "UserFunctionError",
]


class FeedlineError(Exception):
    """Root of every error feedline raises on purpose."""


class ConfigurationError(FeedlineError, ValueError):
    """An argument, option or engine name is invalid."""


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional dependency is needed but not installed."""

    def __init__(self, package: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the optional package {package!r}, which is not installed. "
            f"Fix: pip install 'feedline[{extra}]'"
        )
        self.package = package
        self.extra = extra


class SchemaError(FeedlineError):
    """Columns are missing, differ between inputs, or have the wrong type."""


class DataError(FeedlineError):
    """A record or a file cannot be parsed or decoded."""


class FormatError(FeedlineError):
    """A feedline dataset (manifest or shards) is malformed."""


class IncompleteDatasetError(FormatError):
    """A dataset folder holds an interrupted write and no committed manifest."""


class IntegrityError(FormatError):
    """A shard's checksum, size or row count does not match its manifest."""


class StorageError(FeedlineError):
    """A storage call failed for good: transient faults outlasted the retries, or it was refused.

    ``url`` names the object, ``attempts`` the tries made and ``last_error`` the last
    underlying exception (also chained as ``__cause__``).
    """

    url: str = ""
    attempts: int = 1
    last_error: BaseException | None = None


class ConcurrentWriteError(FeedlineError):
    """Another write to the same dataset path is running, or committed while this one ran."""


class UserFunctionError(FeedlineError):
    """A user-supplied function raised while processing a batch.

    The original exception is chained as ``__cause__`` so its traceback is kept.
    """
