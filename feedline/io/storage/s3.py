"""S3 through s3fs: retries left to botocore under feedline's bound, and conditional requests.

A persistent fault used to be retried by three nested loops (botocore's, s3fs's and
feedline's: up to 5 x 5 x 5 requests for one 503 SlowDown). :func:`backends` builds the two
s3fs filesystems :class:`~feedline.io.storage.retrying_fs.RetryingFileSystem` needs instead,
both with s3fs's own retry loop off (:class:`BoundedS3FileSystem`):

- one whose botocore client retries each request up to ``policy.attempts`` times in all
  (``config_kwargs={"retries": {"mode": "standard", "total_max_attempts": n}}``): for the
  calls that botocore can retry by itself (metadata, listings, uploads, copies, deletes);
- one whose botocore client tries each request once: for the calls feedline retries itself
  because nothing below can (a body that breaks off mid-read, a conditional write whose
  response was lost and whose retry must first check whether it took effect).

So whichever layer retries, a request is sent at most ``policy.attempts`` times.

Conditional requests (``If-Match`` on an ETag, ``If-None-Match: *``) make the commit and the
writer lock free of check-then-write races: :func:`get_versioned` reads an object and its ETag
in one request; writes and deletes pass ``IfMatch=``/``IfNoneMatch=`` to s3fs.
"""

from __future__ import annotations

from collections.abc import Mapping

import fsspec
import s3fs
from fsspec.asyn import sync

from feedline.errors import ConfigurationError
from feedline.io.storage.retry import RetryPolicy

__all__ = ["BoundedS3FileSystem", "backends", "delete_if", "get_versioned", "is_s3"]

#: botocore retry modes feedline accepts from ``config_kwargs["retries"]["mode"]``
_MODES = ("standard", "adaptive", "legacy")


class BoundedS3FileSystem(s3fs.S3FileSystem):
    """s3fs with its own retry loop off: botocore's configured attempts are the only ones.

    (s3fs retries a failed call up to ``retries`` times around botocore's own retries;
    one attempt here keeps a single bound.)
    """

    retries = 1


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    """True for an s3fs filesystem (feedline knows how to configure its retries)."""
    return isinstance(fs, s3fs.S3FileSystem)


def backends(
    fs: s3fs.S3FileSystem, policy: RetryPolicy
) -> tuple[BoundedS3FileSystem, BoundedS3FileSystem]:
    """``(retrying, once)``: ``fs``'s storage with botocore retrying up to ``policy.attempts``
    times, and with botocore trying once (see the module docstring)."""
    options = dict(fs.storage_options)
    config = dict(options.get("config_kwargs") or {})
    user = config.get("retries") or {}
    if not isinstance(user, Mapping) or set(user) - {"mode"}:
        raise ConfigurationError(
            f"storage_options config_kwargs['retries']={user!r} sets botocore's attempts, "
            "which feedline sets from its own retry policy (one bound for all layers). "
            "Fix: drop it and pass storage_options={'retry': fl.RetryPolicy(attempts=...)} "
            "(config_kwargs['retries'] may keep only 'mode')."
        )
    mode = user.get("mode", "standard")
    if mode not in _MODES:
        raise ConfigurationError(
            f"config_kwargs['retries']['mode']={mode!r} is not a botocore retry mode. "
            f"Fix: use one of {list(_MODES)}."
        )

    def build(attempts: int) -> BoundedS3FileSystem:
        retries = {"mode": mode, "total_max_attempts": attempts}
        kwargs = {**options, "config_kwargs": {**config, "retries": retries}}
        return BoundedS3FileSystem(*fs.storage_args, **kwargs)

    return build(policy.attempts), build(1)


def get_versioned(fs: s3fs.S3FileSystem, path: str) -> tuple[bytes, str]:
    """The bytes of the object at ``path`` and their ETag, from one GET request.

    ``FileNotFoundError`` when there is no such object.
    """
    return sync(fs.loop, _get_versioned, fs, path)


async def _get_versioned(fs: s3fs.S3FileSystem, path: str) -> tuple[bytes, str]:
    bucket, key, _ = fs.split_path(path)
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    body = response["Body"]
    try:
        data = await body.read()
    finally:
        body.close()
    return data, str(response.get("ETag", ""))


def delete_if(fs: s3fs.S3FileSystem, path: str, etag: str) -> None:
    """Delete the object at ``path`` only if its ETag is still ``etag``.

    Raises what s3fs raises for a failed precondition (an ``OSError`` caused by a 412
    ``PreconditionFailed``) or ``FileNotFoundError`` when the object is gone.
    """
    bucket, key, _ = fs.split_path(path)
    fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
    fs.invalidate_cache(path)
