#!/usr/bin/env python3
"""Generate the small Hugging Face tokenizer fixtures under tests/data/tokenizers/.

For each tokenizer family (gpt2, llama3, qwen2, llama2, mistral) this trains a ~1000-token BPE
with the `tokenizers` library on the start of the bundled corpus (examples/data/kjv.txt),
wraps it in the same normalizer / pre-tokenizer / decoder / post-processor / added-token
structure as that model's real tokenizer.json on the Hugging Face Hub, and writes

    <family>/tokenizer.json   the tokenizer as the `tokenizers` library saves it
    <family>/expected.json    encode/decode results of the library on a fixed list of strings

The expected outputs are always computed by reloading the written tokenizer.json with
`Tokenizer.from_file`, so they are what the library does with exactly that file. The C++
tests read only these files; Python is needed only to regenerate them.

Deterministic: fixed corpus slice, fixed settings, no timestamps, no randomness. Re-running
with the versions in scripts/tokenizer_fixtures/README.md rewrites identical bytes (the script
prints a size and sha256 prefix per file so a re-run can be compared).

Usage (from anywhere):  /work/venv-hf/bin/python scripts/tokenizer_fixtures/make_tokenizers.py
                        [--out DIR]
"""

import argparse
import hashlib
import json
import re
import sys
import unicodedata
from pathlib import Path

import tokenizers
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "tests" / "data" / "tokenizers"
CORPUS = REPO / "examples" / "data" / "kjv.txt"
CORPUS_BYTES = 300_000
VOCAB_SIZE = 1000  # learned vocabulary (incl. the 256-symbol byte alphabet / byte tokens)

EXPECTED_TOKENIZERS_VERSION = "0.23.3"

# Families whose real Hub file is an old one that spells merges as "a b" strings. The library
# (>= 0.20) saves merges as ["a", "b"] pairs; for these two folders the saved file is rewritten
# to the legacy string spelling (and checked to load and behave identically), so the fixtures
# cover both spellings that occur on the Hub.
LEGACY_MERGES = {"gpt2", "llama2"}

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPIECE = "\u2581"  # ▁

LONG_WORD = "Supercalifragilisticexpialidocious" + "antidisestablishmentarianism"[:26]
assert len(LONG_WORD) == 60 and LONG_WORD.isalpha()

# The same strings for every family. The special tokens of every family appear embedded in
# text, so each family also meets the other families' specials as plain text.
TEST_STRINGS = [
    # plain English, from the corpus and not
    "Hello world",
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers split text into subword units for training.",
    # whitespace
    "  leading spaces",
    "trailing spaces   ",
    "runs    of     spaces",
    " ",
    "",
    "a\n\n\tb",
    "line one\r\nline two",
    "\r\n",
    "And it was so.\n",
    "tab\tseparated\tvalues",
    # digits
    "12345",
    "3.14159",
    "2026-11-24",
    "1,000,000",
    # contractions, mixed case
    "I'm sure DON'T worry, we'll see They'Re here",
    "she'S it'd YOU'VE he'LL",
    # punctuation runs
    "Wait!!! What... really?!",
    # non-ASCII Latin
    "café über straße",
    "naïve café",
    # other scripts
    "Καλημέρα κόσμε",
    "Привет, мир",
    "مرحبا بالعالم",
    "שלום עולם",
    "你好，世界",
    "こんにちは世界、カタカナ",
    "안녕하세요 세계",
    "नमस्ते दुनिया",
    # emoji: single, ZWJ sequence, flag, skin-tone modifier
    "👍",
    "family 👩\u200d👩\u200d👧 flag 🇫🇷 thumbs 👍🏽",
    # combining characters and other NFC-sensitive input
    "e\u0301 vs \u00e9",
    "cafe\u0301 and caf\u00e9",
    "\u212b ohm \u2126 \u1100\u1161",  # ANGSTROM SIGN, OHM SIGN, decomposed Hangul 가
    # special tokens of every family embedded in text
    "hello<|endoftext|>world",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "the end<|end_of_text|>",
    "<s>x</s>",
    "a <unk> b</s> <s> c",
    # literal replacement characters of the two schemes
    "odd \u2581 and \u0120 chars",
    # long words and mixed scripts
    LONG_WORD,
    "a" * 60,
    "abcαβγ123",
]


# --------------------------------------------------------------------------------------------
# Corpus


CHAPTER_HEADER = re.compile(r"^(\S.*) (\d+)$")  # "Genesis 12"


def corpus_lines(keep_newlines):
    """Whole lines of the corpus slice, each verse prefixed by its "chapter:verse" reference
    (counted from the "Book N" headers; the text itself spells all numbers out). Without the
    references the training text has almost no digits, the vocabulary gets no digit merges,
    and the three byte-level digit rules (GPT-2 " ?\\p{N}+", Llama 3 "\\p{N}{1,3}", Qwen2
    "\\p{N}") would all give the same tokens."""
    raw = CORPUS.read_bytes()[:CORPUS_BYTES]
    raw = raw[: raw.rfind(b"\n") + 1]  # whole lines only
    chapter, verse = None, 0
    out = []
    for line in raw.decode("utf-8").splitlines():
        m = CHAPTER_HEADER.match(line)
        if m:
            chapter, verse = int(m.group(2)), 0
        elif line and chapter is not None:
            verse += 1
            line = f"{chapter}:{verse} {line}"
        if keep_newlines:
            out.append(line + "\n")
        elif line:
            out.append(line)
    return out


def train_json(tok, lines, vocab_size, initial_alphabet):
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=initial_alphabet,
    )
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    d = json.loads(tok.to_str())
    vocab = d["model"]["vocab"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in d["model"]["merges"]]
    return vocab, merges


def special(content, normalized=False):
    return AddedToken(
        content, single_word=False, lstrip=False, rstrip=False, normalized=normalized, special=True
    )


# --------------------------------------------------------------------------------------------
# Byte-level families


def train_byte_level(pre_tokenizer, normalizer=None):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    return train_json(tok, corpus_lines(True), VOCAB_SIZE, pre_tokenizers.ByteLevel.alphabet())


def build_gpt2():
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    vocab, merges = train_byte_level(pre)
    # As in GPT-2's file, <|endoftext|> is also the last entry of the model vocabulary.
    vocab = dict(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = None
    tok.pre_tokenizer = pre
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()  # add_prefix_space/trim_offsets/use_regex all true
    tok.add_special_tokens([special("<|endoftext|>", normalized=True)])
    return tok, None


def llama3_like_pre(pattern, trim_offsets):
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=trim_offsets, use_regex=False),
        ]
    )


IGNORE_MERGES_WORD = "Tokenizers"

LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def build_llama3():
    pre = llama3_like_pre(LLAMA3_PATTERN, trim_offsets=True)
    vocab, merges = train_byte_level(pre)
    # One vocabulary entry that no merge produces, so that `ignore_merges: true` changes the
    # result: the pre-token "Tokenizers" (in a test string) is looked up whole and becomes one
    # token; with ignore_merges=false the merges split it. A trained BPE alone never has such
    # an entry (every learned token is reachable by its merges).
    vocab = dict(vocab)
    vocab[IGNORE_MERGES_WORD] = len(vocab)
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            # continuing_subword_prefix / end_of_word_suffix: left unset (null)
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=True,
        )
    )
    tok.normalizer = None
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()  # add_prefix_space/trim_offsets/use_regex all true
    # Added tokens come after the model vocabulary, as 128000.. in the real file.
    tok.add_special_tokens([special(s) for s in LLAMA3_SPECIALS])
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
            processors.TemplateProcessing(
                single=f"{bos}:0 $A:0",
                pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                special_tokens=[(bos, tok.token_to_id(bos))],
            ),
        ]
    )
    return tok, None


QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_qwen2():
    pre = llama3_like_pre(QWEN2_PATTERN, trim_offsets=False)
    vocab, merges = train_byte_level(pre, normalizer=normalizers.NFC())
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([special(s) for s in QWEN2_SPECIALS])

    def fix(d):
        # Qwen2's real file: every ByteLevel field false (the Python decoder API takes none).
        d["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}

    return tok, fix


# --------------------------------------------------------------------------------------------
# SentencePiece-style families (byte fallback)

SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def train_spm_bpe():
    """BPE over ▁-prefixed words (no merges across word boundaries, as SentencePiece with
    split_by_whitespace). Vocabulary layout as in Llama 2: <unk> <s> </s>, <0x00>..<0xFF>,
    then the learned pieces (alphabet first, then one per merge)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = None
    # Training only: words split at "▁" (SentencePiece's split_by_whitespace) and digits kept
    # single (split_digits, as Llama 2 / Mistral were trained: no multi-digit pieces).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="always", split=True),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    n_fixed = len(SPM_SPECIALS) + len(BYTE_TOKENS)
    learned, merges = train_json(tok, corpus_lines(False), VOCAB_SIZE - n_fixed, [])
    vocab = {t: i for i, t in enumerate(SPM_SPECIALS + BYTE_TOKENS)}
    for t, _ in sorted(learned.items(), key=lambda kv: kv[1]):
        assert t not in vocab, t
        vocab[t] = len(vocab)
    return vocab, merges


def spm_model(vocab, merges):
    return models.BPE(
        vocab=vocab,
        merges=merges,
        dropout=None,
        unk_token="<unk>",
        # continuing_subword_prefix / end_of_word_suffix: left unset (null)
        fuse_unk=True,
        byte_fallback=True,
    )


def spm_decoder():
    return decoders.Sequence(
        [decoders.Replace(SPIECE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )


def spm_post(tok):
    return processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )


def build_llama2():
    vocab, merges = train_spm_bpe()
    tok = Tokenizer(spm_model(vocab, merges))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPIECE), normalizers.Replace(" ", SPIECE)])
    tok.pre_tokenizer = None
    tok.decoder = spm_decoder()
    tok.add_special_tokens([special(s) for s in SPM_SPECIALS])
    tok.post_processor = spm_post(tok)
    return tok, None


def build_mistral():
    vocab, merges = train_spm_bpe()
    tok = Tokenizer(spm_model(vocab, merges))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE, prepend_scheme="first", split=False)
    tok.decoder = spm_decoder()
    tok.add_special_tokens([special(s) for s in SPM_SPECIALS])
    tok.post_processor = spm_post(tok)
    return tok, None


FAMILIES = {
    "gpt2": build_gpt2,
    "llama3": build_llama3,
    "qwen2": build_qwen2,
    "llama2": build_llama2,
    "mistral": build_mistral,
}


# --------------------------------------------------------------------------------------------
# Writing and checking


def expected_cases(tok):
    cases = []
    for text in TEST_STRINGS:
        enc = tok.encode(text, add_special_tokens=True)
        enc_ns = tok.encode(text, add_special_tokens=False)
        cases.append(
            {
                "text": text,
                "ids": enc.ids,
                "ids_no_special": enc_ns.ids,
                "tokens": enc.tokens,
                "decoded": tok.decode(enc.ids, skip_special_tokens=False),
                "decoded_skip": tok.decode(enc.ids, skip_special_tokens=True),
            }
        )
    return cases


def to_legacy_merges(json_text):
    d = json.loads(json_text)
    merges = d["model"]["merges"]
    assert all(" " not in a and " " not in b for a, b in merges)
    d["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    return d


def dump(obj):
    # Same layout as the library's pretty printer (2-space indent, raw UTF-8).
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"


def write(path, data):
    path.write_bytes(data)
    h = hashlib.sha256(data).hexdigest()[:12]
    print(f"  {path.relative_to(path.parents[1])}: {len(data)} bytes sha256 {h}")


def check_lossless(name, tok, cases):
    # Texts with no special token of this family decode back exactly (modulo NFC for qwen2).
    specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    n = 0
    for c in cases:
        if any(s in c["text"] for s in specials):
            continue
        want = unicodedata.normalize("NFC", c["text"]) if name == "qwen2" else c["text"]
        if name in ("llama2", "mistral"):
            # The added "▁" is stripped again by the decoder; a literal ▁ comes back as a space.
            want = want.replace(SPIECE, " ")
        got = c["decoded_skip"]
        if got != want:
            print(f"    note: {name} does not round-trip {c['text']!r} -> {got!r}")
        else:
            n += 1
    print(f"    {n} texts round-trip exactly")


def build_family(name, out):
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    tok, fix = FAMILIES[name]()
    text = tok.to_str(pretty=True)
    if fix is not None:
        d = json.loads(text)
        fix(d)
        text = Tokenizer.from_str(json.dumps(d)).to_str(pretty=True)  # the library accepts it
    reference = Tokenizer.from_str(text)
    if name in LEGACY_MERGES:
        data = dump(to_legacy_merges(text)).encode("utf-8")
    else:
        data = (text + "\n").encode("utf-8")
    path = folder / "tokenizer.json"
    write(path, data)

    tok = Tokenizer.from_file(str(path))  # expected outputs come from the written file
    cases = expected_cases(tok)
    # The legacy merges spelling must behave exactly like the library's own spelling.
    assert cases == expected_cases(reference)
    check_lossless(name, tok, cases)
    for c in cases:
        assert c["ids"] == tok.encode(c["text"]).ids
    if name in ("llama2", "mistral"):
        thumbs = next(c for c in cases if c["text"] == "👍")
        assert thumbs["tokens"][-4:] == ["<0xF0>", "<0x9F>", "<0x91>", "<0x8D>"], thumbs
    if name == "llama3":
        plain = json.loads(text)
        plain["model"]["ignore_merges"] = False
        other = expected_cases(Tokenizer.from_str(json.dumps(plain)))
        diff = [c["text"] for c, o in zip(cases, other) if c["ids"] != o["ids"]]
        print(f"    texts whose ids change with ignore_merges=false: {diff}")
        assert any(IGNORE_MERGES_WORD in t for t in diff)
    write(folder / "expected.json", dump(cases).encode("utf-8"))
    vocab = tok.get_vocab_size(with_added_tokens=False)
    full = tok.get_vocab_size(with_added_tokens=True)
    print(f"    model vocab {vocab}, with added tokens {full}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("families", nargs="*", default=list(FAMILIES))
    args = ap.parse_args()
    if tokenizers.__version__ != EXPECTED_TOKENIZERS_VERSION:
        print(
            f"warning: tokenizers {tokenizers.__version__}, fixtures were made with "
            f"{EXPECTED_TOKENIZERS_VERSION}; output may differ",
            file=sys.stderr,
        )
    print(f"tokenizers {tokenizers.__version__}, corpus {CORPUS.name}[:{CORPUS_BYTES}] -> {args.out}")
    for name in args.families:
        build_family(name, args.out)


if __name__ == "__main__":
    main()
