"""``Tokenize`` equals ``tokenizers`` called directly; ``ClipTokenizer`` equals a port of CLIP's
published ``simple_tokenizer`` (below). Vocabularies are trained here; nothing is downloaded."""

from __future__ import annotations

import gzip
import html
import itertools
import json
import pickle
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.errors import ConfigurationError, DataError, FeedlineError, SchemaError
from feedline.preprocess import from_state

tokenizers = pytest.importorskip("tokenizers")
re = pytest.importorskip("regex")

from feedline.preprocess.text.clip_bpe import ClipTokenizer  # noqa: E402
from feedline.preprocess.text.tokenize import Tokenize  # noqa: E402

WORDS = [
    "soft",
    "cotton",
    "shirt",
    "with",
    "long",
    "sleeves",
    "for",
    "men",
    "women",
    "blue",
    "red",
    "black",
    "white",
    "size",
    "small",
    "large",
    "premium",
    "quality",
    "leather",
    "wallet",
    "steel",
    "bottle",
    "wireless",
    "noise",
    "we'll",
    "it's",
    "DON'T",
    "naïve",
    "café",
    "Straße",
    "日本",
    "😀",
]
ODD = [
    "&amp;",
    "&lt;b&gt;",
    "&amp;amp;",
    "  ",
    "\t",
    "\n",
    "!!",
    "...",
    "(2x)",
    "500ml",
    "3.5",
    "#1",
    "'s",
    "'LL",
    "ſ",
    "\u0345",
    "\u0378",
    "<|startoftext|>",
    "x<<|endoftext|>",
    "<|ENDOFTEXT|>",
    "\x00",
    "ΣΑΣ",
    "İ",
]


def make_sentences(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = rng.randint(60, 120) if i % 10 == 0 else rng.randint(0, 20)  # some > 77 tokens
        parts = []
        for _ in range(k):
            r, word = rng.random(), rng.choice(WORDS)
            if r < 0.7:
                parts.append(word.upper() if r < 0.07 else word.capitalize() if r < 0.2 else word)
            elif r < 0.85:
                parts.append(rng.choice(ODD))
            else:
                parts.append("".join(rng.choices("abcxyz0123,.!?'-", k=rng.randint(1, 6))))
        out.append(rng.choice([" ", "  ", " \t"]).join(parts) + rng.choice(["", ".", " !", "  "]))
    return out


SENTENCES = make_sentences()


def batched_table(texts: list[str], rows: int = 37) -> pa.Table:  # several record batches
    table = pa.table({"id": pa.array(range(len(texts))), "text": texts})
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows))


def column(table: pa.Table, name: str) -> np.ndarray:
    return table[name].combine_chunks().to_numpy_ndarray()


def ref_bytes_to_unicode() -> dict[int, str]:
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs, n = bs[:], 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def get_pairs(word: tuple) -> set:
    return set(itertools.pairwise(word))


class ReferenceClip:
    """A straightforward port of OpenAI CLIP's simple_tokenizer.py (without ftfy); with
    ``open_clip=True``, of open_clip's ``SimpleTokenizer``: ftfy first, its token names."""

    def __init__(self, bpe_path: Path, open_clip: bool = False) -> None:
        if open_clip:
            import ftfy

            self.fix = ftfy.fix_text
            self.special = ["<start_of_text>", "<end_of_text>"]
        else:
            self.fix, self.special = (lambda text: text), ["<|startoftext|>", "<|endoftext|>"]
        self.byte_encoder = ref_bytes_to_unicode()
        merges = gzip.decompress(bpe_path.read_bytes()).decode("utf-8").split("\n")
        merges = [tuple(m.split()) for m in merges[1 : 49152 - 256 - 2 + 1]]  # as published
        vocab = list(ref_bytes_to_unicode().values())
        vocab = vocab + [v + "</w>" for v in vocab]
        vocab += ["".join(m) for m in merges] + self.special
        self.encoder = dict(zip(vocab, range(len(vocab)), strict=True))
        self.bpe_ranks = dict(zip(merges, range(len(merges)), strict=True))
        self.cache = {t: t for t in self.special}
        self.pat = re.compile(
            "|".join(map(re.escape, self.special))
            + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
            re.IGNORECASE,
        )

    def bpe(self, token: str) -> str:
        if token in self.cache:
            return self.cache[token]
        word = (*token[:-1], token[-1] + "</w>")
        pairs = get_pairs(word)
        if not pairs:
            return token + "</w>"
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        self.cache[token] = " ".join(word)
        return self.cache[token]

    def encode(self, text: str) -> list[int]:
        text = html.unescape(html.unescape(self.fix(text))).strip()  # basic_clean
        text = " ".join(text.split()).strip().lower()  # whitespace_clean, lower
        ids = []
        for token in re.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return ids

    def __call__(self, texts: list[str], context_length: int = 77) -> np.ndarray:
        sot, eot = (self.encoder[t] for t in self.special)
        result = np.zeros((len(texts), context_length), dtype=np.int64)
        for i, text in enumerate(texts):
            tokens = [sot, *self.encode(text), eot]
            if len(tokens) > context_length:
                tokens = tokens[:context_length]
                tokens[-1] = eot
            result[i, : len(tokens)] = tokens
        return result


def train(kind: str, folder: Path) -> Path:
    """A BERT-like WordPiece (chunked route) or a GPT-2-like byte-level BPE (Rust route)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=400, special_tokens=specials)
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        trainer = trainers.BpeTrainer(
            vocab_size=500,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    tok.train_from_iterator(make_sentences(500, seed=1), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train("wordpiece", tmp_path_factory.mktemp("wp"))


@pytest.fixture(scope="module", params=["wordpiece", "bytelevel"])
def any_tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(request.param, tmp_path_factory.mktemp(request.param))


@pytest.fixture(scope="module")
def clip_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Train a byte-level BPE with '</w>' word ends and write it in CLIP's merges format."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                Regex(r"'s|'t|'re|'ve|'m|'ll|'d|\p{L}+|\p{N}|[^\s\p{L}\p{N}]+"),
                behavior="removed",
                invert=True,
            ),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        min_frequency=2,
        end_of_word_suffix="</w>",
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(make_sentences(800, seed=2), trainer)
    lines = [
        m if isinstance(m, str) else " ".join(m)
        for m in json.loads(tok.to_str())["model"]["merges"]
    ]
    text = "\n".join(["#version: 0.2", *lines]).encode()  # no trailing newline: see clip_bpe
    path = tmp_path_factory.mktemp("clip") / "bpe.txt.gz"
    path.write_bytes(gzip.compress(text))
    return path


@pytest.fixture(scope="module")
def reference(clip_vocab: Path) -> ReferenceClip:
    return ReferenceClip(clip_vocab)


@pytest.fixture(scope="module")
def clip(clip_vocab: Path) -> ClipTokenizer:
    return ClipTokenizer(clip_vocab)


def direct(path: Path, texts: list[str], length: int, special: bool = True) -> tuple:
    """``tokenizers`` called directly, as its documentation shows."""
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.enable_truncation(length)
    tok.enable_padding(length=length, pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    encodings = tok.encode_batch(texts, add_special_tokens=special)
    return (np.array([e.ids for e in encodings]), np.array([e.attention_mask for e in encodings]))


@pytest.mark.parametrize(("length", "special"), [(77, True), (12, True), (9, False)])
def test_tokenize_equals_tokenizers(any_tokenizer: Path, length: int, special: bool) -> None:
    t = Tokenize("text", str(any_tokenizer), max_length=length, add_special_tokens=special)
    chunked = t._backend.specials is not None  # the cached route is taken for WordPiece only
    assert chunked == (any_tokenizer.parent.name.startswith("wordpiece"))
    out = fl.from_arrow(batched_table(SENTENCES)).transform(t).to_arrow()
    assert out.schema.names == ["id", "text", "text_mask"]
    assert out["text"].type == pa.fixed_shape_tensor(pa.int32(), [length])
    assert out["text_mask"].type == pa.fixed_shape_tensor(pa.int8(), [length])
    ids, mask = direct(any_tokenizer, SENTENCES, length, special)
    np.testing.assert_array_equal(column(out, "text"), ids)
    np.testing.assert_array_equal(column(out, "text_mask"), mask)
    assert (mask.sum(1) == length).any() and (mask.sum(1) < length).any()  # both cases met
    for i in (0, 10, 123):
        record = t.transform_record({"id": i, "text": SENTENCES[i]})
        assert record["text"] == ids[i].tolist() and record["text_mask"] == mask[i].tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from([*WORDS, *ODD, "[CLS]", "[MASK]x"]), st.text(max_size=6)),
        max_size=14,
    ),
    st.sampled_from([" ", "  ", "\t", "\u3000 ", "\x1c"]),
)
def test_chunked_route_any_text(wordpiece: Path, parts: list[str], space: str) -> None:
    text = space.join(parts)
    ids, mask = direct(wordpiece, [text], 12)
    got = Tokenize("text", wordpiece, 12).transform_record({"text": text})
    assert got == {"text": ids[0].tolist(), "text_mask": mask[0].tolist()}


def test_chunk_cache_eviction_and_sliced_batches(wordpiece: Path, monkeypatch) -> None:
    import feedline.preprocess.text.tokenize as text_module

    monkeypatch.setattr(text_module, "CACHE_SIZE", 16)  # evicts on nearly every batch
    t = Tokenize("text", wordpiece, 24)
    table = batched_table(SENTENCES, rows=29)  # record batches are slices of one array
    out = fl.from_arrow(table).transform(t).to_arrow(engine=fl.LocalEngine(parallelism=2))
    ids, mask = direct(wordpiece, SENTENCES, 24)
    np.testing.assert_array_equal(column(out, "text"), ids)
    np.testing.assert_array_equal(column(out, "text_mask"), mask)
    distinct = {c for text in SENTENCES for c in text.split(" ")}
    assert len(t._backend._cache) < len(distinct)


def test_unpadded_untruncated_and_outputs(any_tokenizer: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(any_tokenizer))
    table = batched_table(SENTENCES)
    t = Tokenize("text", any_tokenizer, 16, pad=False, output="ids", mask_output="m")
    out = fl.from_arrow(table).transform(t).to_arrow()
    assert out.schema.names == ["id", "text", "ids", "m"]
    tok.enable_truncation(16)
    assert out["ids"].to_pylist() == [e.ids for e in tok.encode_batch(SENTENCES)]
    assert all(set(m) == {1} for m in out["m"].to_pylist() if m)
    tok.no_truncation()
    whole = Tokenize("text", any_tokenizer, 16, pad=False, truncation=False)
    first = table.to_batches()[0]
    got = whole.transform_batch(first)["text"].to_pylist()
    assert got == [e.ids for e in tok.encode_batch(SENTENCES[:37])]
    with pytest.raises(DataError, match=r"row 0 .* more than max_length=16"):
        Tokenize("text", any_tokenizer, 16, truncation=False).transform_batch(first)


def test_left_padding_from_the_tokenizer_file(any_tokenizer: Path, tmp_path: Path) -> None:
    tok = tokenizers.Tokenizer.from_file(str(any_tokenizer))
    tok.enable_padding(direction="left", pad_id=0, pad_token="[PAD]")
    tok.save(str(tmp_path / "left.json"))
    out = Tokenize("text", tmp_path / "left.json", 20).transform_batch(
        pa.record_batch({"text": SENTENCES[:50]})
    )
    tok.enable_truncation(20)
    tok.enable_padding(direction="left", length=20, pad_id=0, pad_token="[PAD]")
    encodings = tok.encode_batch(SENTENCES[:50])
    np.testing.assert_array_equal(out["text"].to_numpy_ndarray(), [e.ids for e in encodings])
    np.testing.assert_array_equal(
        out["text_mask"].to_numpy_ndarray(), [e.attention_mask for e in encodings]
    )


def test_state_round_trip_and_pickle(wordpiece: Path) -> None:
    t = Tokenize("text", f"file://{wordpiece}", 24)
    state = json.loads(json.dumps(t.state))
    assert state["params"]["sha256"] and state["params"]["tokenizer"].endswith("tokenizer.json")
    batch = pa.record_batch({"text": SENTENCES[:60]})
    expected = t.transform_batch(batch)
    for copy in (from_state(state), pickle.loads(pickle.dumps(t))):
        assert copy.transform_batch(batch).equals(expected)
    assert pickle.loads(pickle.dumps(t))._backend is None  # rebuilt lazily on the worker
    tok = tokenizers.Tokenizer.from_file(str(wordpiece))
    inline = Tokenize("text", tok, 24)  # a Tokenizer: copied, and its JSON goes in the state
    assert tok.truncation is None and tok.padding is None  # the caller's is not changed
    rebuilt = from_state(json.loads(json.dumps(inline.state)))
    assert rebuilt.transform_batch(batch).equals(expected)


def test_tokenizer_built_once(wordpiece: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Tokenize("text", wordpiece, 16)
    calls = []
    monkeypatch.setattr(Tokenize, "_load", lambda self: calls.append(1))
    fl.from_arrow(batched_table(SENTENCES, rows=10)).transform(t).analyze()
    assert calls == []


def test_changed_missing_and_invalid_files(
    wordpiece: Path, tmp_path: Path, clip_vocab: Path
) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(wordpiece.read_bytes())
    state = Tokenize("text", path, 8).state
    path.write_text(path.read_text().replace("[MASK]", "[MASQ]"))  # edited after the fact
    with pytest.raises(FeedlineError, match=r"has changed .* SHA-256"):
        from_state(state)
    clip = tmp_path / "clip.txt.gz"
    clip.write_bytes(clip_vocab.read_bytes())
    clip_state = Tokenize("text", f"clip:{clip}", 77).state
    clip.write_bytes(gzip.compress(b"#version: 0.2\na b"))
    with pytest.raises(FeedlineError, match="has changed"):
        from_state(clip_state)
    for missing in (str(tmp_path / "nope.json"), f"clip:{tmp_path / 'nope.txt'}"):
        with pytest.raises(ConfigurationError, match=r"nope\.(json|txt)"):
            Tokenize("text", missing, 8)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match=r"not a valid Hugging Face tokenizer\.json"):
        Tokenize("text", tmp_path / "bad.json", 8)
    (tmp_path / "bad.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(DataError, match=r"Line 2 .* not a merge"):
        ClipTokenizer(tmp_path / "bad.txt")
    with pytest.raises(ConfigurationError):
        Tokenize("text", wordpiece, 0)


def test_column_types_and_nulls(wordpiece: Path) -> None:
    t = Tokenize("text", wordpiece, 10)
    plain = t.transform_batch(pa.record_batch({"text": ["red shirt", "", "blue"]}))
    texts = pa.array(["red shirt", "", "blue"])
    for array in (
        texts.cast(pa.large_string()),
        texts.dictionary_encode(),
        texts.cast(pa.string_view()),
    ):
        assert t.transform_batch(pa.record_batch({"text": array}))["text"].equals(plain["text"])
    with pytest.raises(SchemaError, match=r"'text' .* has type int64"):
        t.transform_batch(pa.record_batch({"text": [1, 2]}))
    with pytest.raises(SchemaError, match="needs column"):
        t.transform_batch(pa.record_batch({"other": ["a"]}))
    nulls = pa.record_batch({"text": ["red shirt", None, "blue"]})
    with pytest.raises(DataError, match=r"1 null value\(s\) .*first at row 1"):
        t.transform_batch(nulls)
    empty = Tokenize("text", wordpiece, 10, on_null="empty").transform_batch(nulls)
    assert empty["text"].equals(plain["text"])
    none = t.transform_batch(pa.record_batch({"text": pa.array([], pa.string())}))
    assert none.num_rows == 0 and none["text"].type == plain["text"].type


def test_clip_equals_reference(
    clip: ClipTokenizer, clip_vocab: Path, reference: ReferenceClip, tmp_path: Path
) -> None:
    assert clip.vocab_size == len(reference.encoder)
    assert clip.encode_batch(SENTENCES) == [reference.encode(s) for s in SENTENCES]
    assert any(len(reference.encode(s)) > 75 for s in SENTENCES)  # truncation is exercised
    np.testing.assert_array_equal(clip(SENTENCES), reference(SENTENCES))
    np.testing.assert_array_equal(clip(SENTENCES, 10), reference(SENTENCES, 10))
    (tmp_path / "bpe.txt").write_bytes(gzip.decompress(clip_vocab.read_bytes()))
    plain = ClipTokenizer(tmp_path / "bpe.txt")  # not gzipped: the same
    assert plain.encode_batch(SENTENCES[:50]) == [reference.encode(s) for s in SENTENCES[:50]]
    assert pickle.loads(pickle.dumps(clip)).encode_batch(SENTENCES) == clip.encode_batch(SENTENCES)
    oc = ClipTokenizer(clip_vocab, special_tokens=["<start_of_text>", "<end_of_text>"])  # open_clip
    assert oc.encode("X <start_of_text>") == [*clip.encode("x"), oc.sot_token_id] != oc.encode("x")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(WORDS + ODD), st.text(max_size=8)), max_size=12))
def test_clip_any_text_equals_reference(
    clip: ClipTokenizer, reference: ReferenceClip, parts: list[str]
) -> None:
    assert clip.encode(" ".join(parts)) == reference.encode(" ".join(parts))


def test_tokenize_with_clip(clip_vocab: Path, reference: ReferenceClip) -> None:
    t = Tokenize("text", f"clip:{clip_vocab}", max_length=77)
    out = fl.from_arrow(batched_table(SENTENCES)).transform(t).to_arrow()
    expected = reference(SENTENCES)
    np.testing.assert_array_equal(column(out, "text"), expected)
    length = np.array([len(reference.encode(s)) + 2 for s in SENTENCES]).clip(max=77)
    np.testing.assert_array_equal(column(out, "text_mask").sum(1), length)
    assert t.transform_record({"text": SENTENCES[3]})["text"] == expected[3].tolist()
    batch = pa.record_batch({"text": SENTENCES[:40]})
    assert (
        from_state(json.loads(json.dumps(t.state)))
        .transform_batch(batch)
        .equals(t.transform_batch(batch))
    )
    via_instance = Tokenize("text", ClipTokenizer(clip_vocab), 77)
    assert from_state(via_instance.state).transform_batch(batch).equals(t.transform_batch(batch))
    bare = Tokenize("text", f"clip:{clip_vocab}", 5, add_special_tokens=False, pad=False)
    assert bare.transform_batch(batch)["text"].to_pylist() == [
        reference.encode(s)[:5] for s in SENTENCES[:40]
    ]


def test_transform_of_a_bare_tokenizer_points_to_tokenize(clip_vocab: Path) -> None:
    # ds.transform(fl.ClipTokenizer(path)) said "use e.g. fl.StandardScaler"
    from tokenizers import Tokenizer, models

    ds = fl.from_arrow(batched_table(SENTENCES[:4]))
    for tokenizer in (ClipTokenizer(clip_vocab), Tokenizer(models.BPE())):
        with pytest.raises(fl.ConfigurationError) as caught:
            ds.transform(tokenizer)
        message = str(caught.value)
        assert type(tokenizer).__name__ in message
        assert "fl.Tokenize('text', tokenizer=" in message and "Fix:" in message
        assert "StandardScaler" not in message
    the_fix = ds.transform(Tokenize("text", tokenizer=ClipTokenizer(clip_vocab), max_length=77))
    assert the_fix.to_arrow().column_names[-2:] == ["text", "text_mask"]
    with pytest.raises(fl.ConfigurationError, match="StandardScaler"):
        ds.transform(len)  # not a tokenizer: the general advice


# Text that ftfy, HTML unescaping, Unicode case rules and truncation each change
ADVERSARIAL = [
    "",
    " ",
    " \t\n ",
    "&amp;amp;",
    "&amp;amp;amp;lt;b&amp;amp;gt;",
    "Fish &amp; Chips &nbsp;x",
    "&lt;b&gt;bold&lt;/b&gt; it&#x2019;s &#8220;q&#8221; &hellip;",
    "<b>&amp;amp;</b> &copy",
    "â€œquotedâ€\x9d",
    "â€œquotedâ€",
    "Ã©tÃ© sÃ³ voilÃ\xa0le travail",
    "âœ” No problems",
    "ﬁsh ﬂow ﬀ",
    "ＬＯＵＤ\u3000ＮＯＩＳＥＳ",
    "e\u0301 cafe\u0301 Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǫ̗̻ n\u0303",
    "\ufeffhello \ufeff world",
    "\x00\x01\x1b[31mred\x1b[0m\x7f \x0b\x0c\x1c\x1d\x85 a\r\nb\rc",
    "😀 👍🏽 👨\u200d👩\u200d👧 🇫🇷",
    "日本語のテキスト 中文 한국어",
    "“curly” ‘single’ — dash… ",
    "İstanbul ΣΑΣ Straße ſ \u0345 \u0378",
    "<start_of_text> x <END_OF_TEXT> <|endoftext|>",
    "it's WE'LL don't 12,345.6 #1 (2x)",
    "\ud83d\ude00 \ud800 lone surrogates",
    " ".join(SENTENCES[:40]),
    "ab" * 300,
    "x" * 1500,  # far over the context length
]


@pytest.fixture(scope="module")
def open_clip_reference(clip_vocab: Path) -> ReferenceClip:
    return ReferenceClip(clip_vocab, open_clip=True)


@pytest.fixture(scope="module")
def open_clip(clip_vocab: Path) -> ClipTokenizer:
    return ClipTokenizer(clip_vocab, preset="open_clip")


def test_open_clip_preset_equals_reference(
    open_clip: ClipTokenizer, clip: ClipTokenizer, open_clip_reference: ReferenceClip
) -> None:
    ref, texts = open_clip_reference, ADVERSARIAL + SENTENCES
    assert open_clip.special_tokens == ("<start_of_text>", "<end_of_text>")
    assert open_clip.vocab_size == len(ref.encoder)
    assert open_clip.encode_batch(texts) == [ref.encode(t) for t in texts]
    got, expected = open_clip(texts), ref(texts)
    assert got.dtype == np.int64 and got.shape == (len(texts), 77)
    np.testing.assert_array_equal(got, expected)
    assert (got[:, -1] == open_clip.eot_token_id).sum() >= 5  # cut rows keep the end token
    np.testing.assert_array_equal(open_clip(texts, 4), ref(texts, 4))
    np.testing.assert_array_equal(open_clip(ADVERSARIAL[3]), ref([ADVERSARIAL[3]]))
    # what the default leaves out: ftfy changes most of the adversarial texts
    differ = [
        a != b
        for a, b in zip(
            clip.encode_batch(ADVERSARIAL[:-4]),
            open_clip.encode_batch(ADVERSARIAL[:-4]),
            strict=True,
        )
    ]
    assert sum(differ) >= 12 and clip(["a"]).dtype == np.int32


MOJIBAKE = st.lists(
    st.sampled_from([*"âÃ€œ\x9d©¨Â\xa0³ﬁ＆&;#<> \n\r\t\x00\x1bab", "&lt;"]), max_size=12
).map("".join)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(WORDS + ODD + ADVERSARIAL[:-3]), st.text(max_size=8), MOJIBAKE),
        max_size=8,
    ),
    st.sampled_from([" ", "", "\n", "&amp;"]),
)
def test_open_clip_preset_any_text(
    open_clip: ClipTokenizer, open_clip_reference: ReferenceClip, parts: list[str], joint: str
) -> None:
    text = joint.join(parts)
    assert open_clip.encode(text) == open_clip_reference.encode(text)


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(["\t", "\n", *(chr(c) for c in range(32, 127) if c != 38)])))
def test_ftfy_leaves_the_texts_it_skips_unchanged(text: str) -> None:
    import ftfy

    from feedline.preprocess.text.clip_bpe import _FTFY_IDENTITY

    assert _FTFY_IDENTITY.fullmatch(text)
    assert ftfy.fix_text(text) == text
    assert not any(_FTFY_IDENTITY.fullmatch(chr(c)) for c in [*range(9), *range(11, 32), 38, 127])


def test_open_clip_preset_options_state_and_errors(
    clip_vocab: Path, open_clip: ClipTokenizer, open_clip_reference: ReferenceClip
) -> None:
    t = Tokenize("text", open_clip, 77)
    out = fl.from_arrow(batched_table(ADVERSARIAL[:-6] + SENTENCES[:60])).transform(t).to_arrow()
    np.testing.assert_array_equal(
        column(out, "text"), open_clip_reference(ADVERSARIAL[:-6] + SENTENCES[:60])
    )
    batch = pa.record_batch({"text": ADVERSARIAL[:-6]})
    rebuilt = from_state(json.loads(json.dumps(t.state)))
    assert rebuilt._backend.preset == "open_clip"
    assert rebuilt.transform_batch(batch).equals(t.transform_batch(batch))
    copy = pickle.loads(pickle.dumps(open_clip))
    assert copy.preset == "open_clip" and copy.encode(ADVERSARIAL[8]) == open_clip.encode(
        ADVERSARIAL[8]
    )
    same = ClipTokenizer(
        clip_vocab,
        preset="open_clip",
        fix_text=True,
        special_tokens=["<start_of_text>", "<end_of_text>"],
    )
    assert same.encode_batch(ADVERSARIAL) == open_clip.encode_batch(ADVERSARIAL)
    with pytest.raises(ConfigurationError, match=r"preset='openclip' is not known.*Fix:"):
        ClipTokenizer(clip_vocab, preset="openclip")
    for wrong in (
        {"fix_text": False},
        {"num_merges": 10},
        {"special_tokens": ["<|startoftext|>", "<|endoftext|>"]},
    ):
        with pytest.raises(ConfigurationError, match=r"always runs ftfy.*Fix:"):
            ClipTokenizer(clip_vocab, preset="open_clip", **wrong)
