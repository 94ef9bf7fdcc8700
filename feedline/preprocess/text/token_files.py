"""Tokenizer files (vocabularies, merges, ``tokenizer.json``) read through fsspec and checked
against the SHA-256 a preprocessor saved with its state, so token ids keep matching training.
"""

from __future__ import annotations

import hashlib

import fsspec

from feedline.errors import ConfigurationError, IntegrityError

__all__ = ["read_source"]


def read_source(path: str, sha256: str | None = None, what: str = "tokenizer") -> tuple[bytes, str]:
    """Read a file through fsspec; return its bytes and SHA-256 (checked against ``sha256``)."""
    try:
        with fsspec.open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError as exc:
        raise ConfigurationError(
            f"The {what} file {path!r} does not exist. Fix: check the path (any fsspec URL "
            "works, e.g. s3://bucket/tokenizer.json)."
        ) from exc
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigurationError(
            f"Cannot read the {what} file {path!r}: {type(exc).__name__}: {exc}. Fix: check "
            "the path and that the filesystem's fsspec package is installed."
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        raise IntegrityError(
            f"The {what} file {path!r} has changed since this preprocessor was defined: its "
            f"SHA-256 is {digest[:16]}…, the saved state expects {sha256[:16]}…. Token ids "
            "would no longer match training. Fix: restore the original file, or re-create the "
            "preprocessor with the new file (and re-tokenize the data)."
        )
    return data, digest
