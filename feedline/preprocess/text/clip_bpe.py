"""CLIP's byte-level BPE tokenizer (OpenAI ``simple_tokenizer``, as in open_clip), exact and fast.

Same vocabulary layout, clean-up, split pattern, byte-to-unicode map and merge order as the
published code, so the ids match it. Fast because each space-separated chunk of the cleaned
text is split once (with Python's ``regex``, the published engine; ASCII chunks with an
equivalent pattern and ``re``), byte-mapped, merged by the Rust BPE model of ``tokenizers``
and cached: a typical row costs a split and one dict lookup per word. Rust's ``Split``
pre-tokenizer is not used: Oniguruma and ``regex`` disagree on ~1 900 code points (mostly
unassigned ones, and U+0345 under case folding), and the full Rust pipeline was slower.

Two presets. ``preset="open_clip"`` equals open_clip's ``SimpleTokenizer`` (``clean="lower"``)
exactly: ``ftfy.fix_text`` (it repairs mojibake, applies NFC, straightens quotes, expands
ligatures, drops control characters and unescapes HTML once more), then HTML unescaping
twice, whitespace clean-up and lower-casing; ``<start_of_text>``/``<end_of_text>``; ``int64``
rows of ``context_length`` that keep the end token when cut. Its cost is ftfy, ~80 µs a
text; it is skipped on printable ASCII without ``&``, which ftfy leaves as is. Measured on
2 busy cores: on English sentences (88 % such ASCII, the rest mostly curly quotes) the
preset takes 1.3-2x the default's time, on mostly non-ASCII text 6-13x, and open_clip's own
``SimpleTokenizer`` 10-28x. The default, ``preset="fast"``, is OpenAI's tokenizer without
ftfy: OpenAI's token names ``<|startoftext|>``/``<|endoftext|>``, ``int32`` rows, and ids
that differ from open_clip's only where ftfy changes the text (curly quotes, mojibake,
ligatures, width, control characters, a third level of HTML escaping).
Blank lines of the merges file are ignored (the published code turns a short file's
trailing newline into an empty vocabulary entry; it cuts the 16e6 file at merge 48 894,
before its end). The id-array helpers it shares with :mod:`feedline.preprocess.text.tokenize`
live in :mod:`feedline.preprocess.text.token_arrays`, the file reading in
:mod:`feedline.preprocess.text.token_files` (both re-exported here).
"""

from __future__ import annotations

import gzip
import html
import re as std_re
from collections.abc import Iterable, Sequence
from functools import lru_cache, partial
from typing import Any

import numpy as np

from feedline.errors import ConfigurationError, DataError, MissingDependencyError
from feedline.preprocess.text.token_arrays import frame, pack_chunks
from feedline.preprocess.text.token_files import read_source

__all__ = ["PRESETS", "WORDS_PATTERN", "ClipTokenizer", "bytes_to_unicode", "clean_text"]

#: OpenAI's names of the start/end tokens
SPECIAL_TOKENS = ("<|startoftext|>", "<|endoftext|>")
#: open_clip's names of the start/end tokens
OPEN_CLIP_SPECIAL_TOKENS = ("<start_of_text>", "<end_of_text>")
#: ``ClipTokenizer(preset=...)``: the fast default, or open_clip's ``SimpleTokenizer`` exactly
PRESETS = ("fast", "open_clip")
# Texts ``ftfy.fix_text`` returns unchanged: printable ASCII, tab and newline, without "&"
# (no mojibake, ligature, wide or curly character, escape, control character or entity)
_FTFY_IDENTITY = std_re.compile(r"[\t\n -%'-~]*")
#: CLIP's split pattern after the special tokens (compiled with IGNORECASE, as published)
WORDS_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
# After clean-up an ASCII text is lower-case with single spaces: there the pattern reduces to
_ASCII_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d|[a-z]+|[0-9]|[^ a-z0-9]+"
#: Entries of the per-tokenizer cache of chunk -> ids (emptied when full)
CACHE_SIZE = 1 << 18
#: CLIP keeps merges[1 : 49152 - 256 - 2 + 1] of the vocabulary file
DEFAULT_NUM_MERGES = 49152 - 256 - 2


@lru_cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from the 256 byte values to printable characters.

    Examples
    --------
    >>> table = bytes_to_unicode()
    >>> table[ord("a")], table[ord(" ")], len(table)
    ('a', 'Ġ', 256)
    """
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def clean_text(text: str, fix_text: bool = False) -> str:
    """CLIP's clean-up: (ftfy), HTML-unescape twice, collapse whitespace, lower-case.

    Examples
    --------
    >>> clean_text("  A &amp;amp; B\\n\\tC  ")
    'a & b c'
    """
    if fix_text and not _FTFY_IDENTITY.fullmatch(text):
        text = _ftfy().fix_text(text)
    return " ".join(html.unescape(html.unescape(text)).split()).lower()


def _ftfy() -> Any:
    try:
        import ftfy
    except ImportError as exc:
        raise ConfigurationError(
            "ClipTokenizer(fix_text=True) and preset='open_clip' need the package 'ftfy'. Fix: "
            "pip install 'feedline[text]' (or ftfy), or use the default preset='fast'."
        ) from exc
    return ftfy


def _preset(
    preset: str, fix_text: bool | None, special_tokens: Sequence[str] | None, num_merges: int
) -> tuple[bool, tuple[str, ...]]:
    """The ``fix_text`` and special tokens of a preset (explicit values must agree)."""
    if preset not in PRESETS:
        raise ConfigurationError(
            f"ClipTokenizer: preset={preset!r} is not known. Fix: use one of {list(PRESETS)}."
        )
    if preset == "fast":
        return bool(fix_text), tuple(SPECIAL_TOKENS if special_tokens is None else special_tokens)
    names = OPEN_CLIP_SPECIAL_TOKENS if special_tokens is None else tuple(special_tokens)
    if fix_text is False or num_merges != DEFAULT_NUM_MERGES or names != OPEN_CLIP_SPECIAL_TOKENS:
        raise ConfigurationError(
            "ClipTokenizer(preset='open_clip') is open_clip's SimpleTokenizer, so it always "
            f"runs ftfy, keeps {DEFAULT_NUM_MERGES} merges and names its tokens "
            f"{OPEN_CLIP_SPECIAL_TOKENS}; got fix_text={fix_text}, num_merges={num_merges}, "
            f"special_tokens={special_tokens}. Fix: drop those arguments, or use preset='fast'."
        )
    return True, OPEN_CLIP_SPECIAL_TOKENS


def parse_merges(data: bytes, where: str, num_merges: int = DEFAULT_NUM_MERGES) -> list[tuple]:
    """The merges of a CLIP vocabulary file (optionally gzipped; the first line is a header)."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise DataError(
                f"{where} is not a valid gzip file: {exc}. Fix: re-download it."
            ) from exc
    try:
        lines = data.decode("utf-8").split("\n")[1:]
    except UnicodeDecodeError as exc:
        raise DataError(f"{where} is not UTF-8 text: {exc}. Fix: pass CLIP's merges file.") from exc
    merges = []
    for number, line in enumerate(lines, start=2):
        parts = tuple(line.split())
        if not parts:
            continue
        if len(parts) != 2:
            raise DataError(
                f"Line {number} of {where} is {line[:80]!r}, not a merge 'a b'. Fix: pass a "
                "CLIP BPE vocabulary (a header line, then one merge per line)."
            )
        merges.append(parts)
        if len(merges) == num_merges:
            break
    if not merges:
        raise DataError(f"{where} holds no merges. Fix: pass CLIP's bpe_simple_vocab_16e6.txt.gz.")
    return merges


class ClipTokenizer:
    """OpenAI CLIP's BPE tokenizer built from a merges file (``bpe_simple_vocab_16e6.txt.gz``).

    Parameters
    ----------
    vocab_path:
        Path or URL (fsspec) of the merges file, plain or gzipped. CLIP's is
        ``bpe_simple_vocab_16e6.txt.gz`` (SHA-256 ``924691ac…6804a``), not shipped with
        feedline: it is in the ``open-clip-torch`` wheel
        (``importlib.resources.files("open_clip") / "bpe_simple_vocab_16e6.txt.gz"``) and in
        OpenAI's CLIP repository (see the text how-to).
    context_length:
        Row length of :meth:`__call__` (CLIP models use 77).
    num_merges:
        How many merges to keep (CLIP: 48 894, giving 49 408 ids).
    preset:
        ``"fast"`` (default): OpenAI's tokenizer without ftfy, ``int32`` rows.
        ``"open_clip"``: equal to open_clip's ``SimpleTokenizer`` (ftfy, its token names,
        ``int64`` rows); see the module documentation for what differs and what it costs.
    fix_text:
        Apply ``ftfy.fix_text`` first, as the published code does (needs ``ftfy``).
        Default: what the preset does.
    sha256:
        Expected SHA-256 of the file; a different file raises ``IntegrityError``.
    special_tokens:
        Names of the start and end tokens (ids 49406, 49407), matched in the text too.
        Default: the preset's (OpenAI's, or open_clip's ``<start_of_text>``, ``<end_of_text>``).

    Examples
    --------
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "merges.txt")
    >>> _ = open(path, "w").write("#version: 0.2\\nc a\\nca t</w>")
    >>> tok = ClipTokenizer(path, context_length=6)
    >>> tok.encode("Cat cat!")
    [513, 513, 256]
    >>> tok(["Cat"]).tolist()
    [[514, 513, 515, 0, 0, 0]]
    >>> tok.decode([513, 513])
    'cat cat '
    >>> oc = ClipTokenizer(path, context_length=6, preset="open_clip")
    >>> ids = oc(["ﬁ &amp;amp;"])  # ftfy expands the ligature; entities are unescaped
    >>> ids.tolist(), ids.dtype.name, oc.decode(ids[0, 1:4])
    ([[514, 69, 328, 261, 515, 0]], 'int64', 'fi & ')
    """

    def __init__(
        self,
        vocab_path: str,
        context_length: int = 77,
        *,
        num_merges: int = DEFAULT_NUM_MERGES,
        fix_text: bool | None = None,
        sha256: str | None = None,
        special_tokens: Sequence[str] | None = None,
        preset: str = "fast",
    ) -> None:
        try:
            import regex as re
            from tokenizers import models
        except ImportError as exc:
            raise MissingDependencyError(exc.name or "tokenizers", "text", "ClipTokenizer") from exc

        self.path = str(vocab_path)
        self.context_length = int(context_length)
        self.num_merges = int(num_merges)
        self.preset = preset
        fix_text, special_tokens = _preset(preset, fix_text, special_tokens, self.num_merges)
        self.fix_text = bool(fix_text)
        self.dtype = np.dtype(np.int64 if preset == "open_clip" else np.int32)
        self._fix = _ftfy().fix_text if self.fix_text else None
        data, self.sha256 = read_source(self.path, sha256, "CLIP vocabulary")
        merges = parse_merges(data, self.path, self.num_merges)
        chars = list(bytes_to_unicode().values())
        self.special_tokens = sot, eot = tuple(special_tokens)
        vocab = [*chars, *(c + "</w>" for c in chars), *("".join(m) for m in merges), sot, eot]
        self.encoder: dict[str, int] = {token: i for i, token in enumerate(vocab)}
        self.sot_token_id, self.eot_token_id = self.encoder[sot], self.encoder[eot]
        self.pad_id, self.left = 0, False  # how Tokenize pads (as open_clip does)
        self.vocab_size = len(vocab)
        self._model = models.BPE(
            vocab=self.encoder, merges=merges, end_of_word_suffix="</w>", fuse_unk=False
        )
        specials = "|".join(re.escape(t) for t in self.special_tokens)
        self._pattern = re.compile(f"{specials}|{WORDS_PATTERN}", re.IGNORECASE)
        self._ascii = std_re.compile(_ASCII_WORDS)
        self._cache = self._new_cache()

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str) -> list[int]:
        """Ids of one text without start/end tokens (CLIP's ``SimpleTokenizer.encode``)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text, without start/end tokens and without truncation."""
        flat, lengths = self.encode_flat(texts)
        parts = np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
        return [part.tolist() for part in parts]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all texts concatenated (``int32``) and each text's count (``int64``)."""
        get, miss, unescape = self._cache.get, self._chunk_ids, html.unescape
        fix, safe = self._fix, _FTFY_IDENTITY.fullmatch
        lists: list[list[int]] = []
        counts: list[int] = []
        for text in texts:
            if fix is not None and not safe(text):
                text = fix(text)
            if "&" in text:
                text = unescape(unescape(text))
            # no piece spans a space: the ids of each space-separated chunk are cached
            chunks = text.lower().split()
            lists += [get(chunk) or miss(chunk) for chunk in chunks]
            counts.append(len(chunks))
        return pack_chunks(lists, counts, len(texts))

    def encode_ids(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], tuple[int, ...]]:
        """:meth:`encode_flat`, and the start/end ids to put around each row (for ``Tokenize``)."""
        ends = ((self.sot_token_id,), (self.eot_token_id,)) if add_special_tokens else ((), ())
        return (*self.encode_flat(texts), *ends)

    def _chunk_ids(self, chunk: str) -> list[int]:
        """Split one chunk with the CLIP pattern, BPE-merge each piece in Rust; cache it."""
        simple = chunk.isascii() and not any(t.lower() in chunk for t in self.special_tokens)
        table, ids = bytes_to_unicode(), []
        for piece in (self._ascii if simple else self._pattern).findall(chunk):
            known = self._cache.get(piece)
            if known is None:
                mapped = "".join(table[b] for b in piece.encode())
                known = [t.id for t in self._model.tokenize(mapped)]
            ids += known
        if len(self._cache) >= CACHE_SIZE:
            self._cache = self._new_cache()
        self._cache[chunk] = ids
        return ids

    def _new_cache(self) -> dict[str, list[int]]:
        return {
            t: [i]
            for t, i in zip(
                self.special_tokens, (self.sot_token_id, self.eot_token_id), strict=True
            )
        }

    def __call__(self, texts: str | Sequence[str], context_length: int | None = None) -> Any:
        """An array ``(len(texts), context_length)``: start, ids, end, zero padding.

        Texts too long keep their first ``context_length - 2`` ids and the end token. The
        dtype is ``int32``, or ``int64`` (as torch's ``LongTensor``) with ``preset="open_clip"``.
        """
        texts = [texts] if isinstance(texts, str) else list(texts)
        length = int(context_length or self.context_length)
        ids, _, _ = frame(
            *self.encode_flat(texts),
            length,
            0,
            prefix=(self.sot_token_id,),
            suffix=(self.eot_token_id,),
        )
        return ids.astype(self.dtype, copy=False)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids (end-of-word markers become spaces), as CLIP's ``decode``."""
        decoder = {i: t for t, i in self.encoder.items()}
        byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        text = "".join(decoder[int(i)] for i in ids)
        data = bytearray(byte_decoder[c] for c in text)
        return data.decode("utf-8", errors="replace").replace("</w>", " ")

    def __reduce__(self) -> tuple:  # rebuilt (and the file checked) where it is unpickled
        return (
            partial(ClipTokenizer, sha256=self.sha256, **self.options()),
            (self.path, self.context_length),
        )

    def options(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this tokenizer from its file (JSON-safe)."""
        return {
            "num_merges": self.num_merges,
            "fix_text": self.fix_text,
            "special_tokens": list(self.special_tokens),
            "preset": self.preset,
        }

    def __repr__(self) -> str:
        return f"ClipTokenizer({self.path!r}, vocab_size={self.vocab_size})"
