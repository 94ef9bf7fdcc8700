"""``fl.Packing``: what to pack and how, checked once."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from feedline.errors import ConfigurationError
from feedline.loader.checks import checked_int

__all__ = ["ALGORITHMS", "BOUNDARIES", "OVERLONG", "Packing"]

#: how documents are placed into rows
ALGORITHMS = ("greedy", "first_fit", "best_fit")
#: what happens to a document longer than ``seq_len``
OVERLONG = ("split", "drop")
#: how the rows' document boundaries are given
BOUNDARIES = ("cu_seqlens", "mask")


@dataclass(frozen=True)
class Packing:
    """Pack a token column into rows of exactly ``seq_len`` tokens (``ds.loader(pack=...)``).

    Parameters
    ----------
    seq_len:
        Tokens per row.
    column:
        The token column: a ``list<int32>`` / ``list<int64>`` of variable length (``fl.Tokenize``
        with ``max_length=None`` writes one).
    algorithm:
        ``"greedy"``: documents in order, a new row when the next one does not fit (rows keep
        the order); ``"first_fit"`` / ``"best_fit"``: the buffer's documents, longest first,
        each into the first row it fits / the fullest row it fits (less padding).
    buffer_size:
        Documents packed together (the loader's order, ``buffer_size`` at a time): bounds memory
        (one buffer of documents and its rows) and is the unit of the checkpoint. A buffer's last
        row is padded, so a larger buffer pads less.
    overlong:
        A document longer than ``seq_len``: ``"split"`` into pieces of ``seq_len`` (each piece
        a document of its own: positions restart), or ``"drop"`` it (counted in
        ``loader.metrics()``).
    boundaries:
        ``"cu_seqlens"``: a ``(batch, max_docs + 2)`` int32 ``cu_seqlens`` per row (0, the end
        of each document, then ``seq_len``: the padding is a last segment; repeated
        ``seq_len`` after) and ``num_docs``; ``"mask"``: a ``(batch, seq_len, seq_len)`` bool
        block-diagonal ``attention_mask`` (True where two tokens are in one document; combine
        it with a causal mask).
    max_docs:
        Most documents in one row (a row is closed when it holds this many), so
        ``cu_seqlens`` has a fixed width.
    ignore_index:
        The label where there is no next token of the same document (each document's last
        token, padding).
    pad_id:
        The token that fills a row's end.
    equal_batches:
        Every rank yields the same number of batches in an epoch (ranks pack different
        documents, so their counts differ; a DDP step waits on every rank): a rank whose rows
        run out yields batches of empty rows (all ``pad_id``, ``labels`` all
        ``ignore_index``, ``num_docs`` 0) until the rank with the most batches is done. The
        count is a pure function of the order: at an epoch's start each rank plans every
        rank's documents (reading the epoch's token column once more); it is kept in the
        checkpoint. On another number of ranks, the new ranks are evened from the resume
        point (each plans every new rank's rows left).

    Notes
    -----
    ``labels`` are shifted: ``labels[i]`` is the token at ``i + 1`` when it belongs to the
    same document, else ``ignore_index``; compute the loss on ``logits[i]`` vs ``labels[i]``
    without shifting again. ``position_ids`` restart at 0 at each document (and the padding).

    Examples
    --------
    >>> import feedline as fl
    >>> fl.Packing(seq_len=8, algorithm="best_fit").buffer_size
    1024
    >>> fl.Packing(seq_len=0)
    Traceback (most recent call last):
    ...
    feedline.errors.ConfigurationError: Packing: seq_len must be an int >= 2, got 0. Fix: ...
    """

    seq_len: int
    column: str = "input_ids"
    algorithm: str = "greedy"
    buffer_size: int = 1024
    overlong: str = "split"
    boundaries: str = "cu_seqlens"
    max_docs: int = 64
    ignore_index: int = -100
    pad_id: int = 0
    equal_batches: bool = False

    def __post_init__(self) -> None:
        keep = object.__setattr__
        keep(self, "seq_len", _count("seq_len", self.seq_len, 2))
        keep(self, "buffer_size", _count("buffer_size", self.buffer_size, 1))
        keep(self, "max_docs", _count("max_docs", self.max_docs, 1))
        if not isinstance(self.equal_batches, bool):
            raise ConfigurationError(
                f"Packing: equal_batches must be True or False, got {self.equal_batches!r}. "
                "Fix: pass equal_batches=True or False."
            )
        for name in ("ignore_index", "pad_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(
                    f"Packing: {name} must be an int, got {value!r}. Fix: e.g. {name}=0."
                )
        for name, allowed in (("algorithm", ALGORITHMS), ("overlong", OVERLONG),
                              ("boundaries", BOUNDARIES)):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ConfigurationError(
                    f"Packing: {name}={getattr(self, name)!r} is not one of {allowed}. Fix: "
                    f"pass one of those."
                )
        if not isinstance(self.column, str) or not self.column:
            raise ConfigurationError(
                f"Packing: column={self.column!r} must name the token column. Fix: e.g. "
                "column='input_ids'."
            )

    def as_dict(self) -> dict[str, Any]:
        """The settings, JSON-safe (kept in the checkpoint: a resume must pack the same way)."""
        return asdict(self)


def _count(name: str, value: Any, low: int) -> int:
    def fail(expected: str) -> ConfigurationError:
        return ConfigurationError(
            f"Packing: {name} must be {expected}, got {value!r}. Fix: pass {name}={low} or more."
        )

    return checked_int(value, low, fail=fail)
