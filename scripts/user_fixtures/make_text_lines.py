#!/usr/bin/env python3
"""Expected ids for data.text_documents lines (tests/data/user_files/models/expected/lines.*).

A .txt corpus the way Hugging Face's run_clm reads it: datasets' text loader with
keep_linebreaks=True (run_clm's default), one row per line, each row tokenized with
add_special_tokens (the post-processor's BOS per line), the rows concatenated.
Needs: datasets, transformers, tokenizers (no torch). Run from the repository root:
  python3 scripts/user_fixtures/make_text_lines.py
"""
import os

import datasets
import transformers

ROOT = os.path.join("tests", "data", "user_files", "models")
MODEL = os.path.join(ROOT, "llama3-instruct")
EXPECTED = os.path.join(ROOT, "expected")
# CRLF and a lone CR (universal newlines make both "\n"), a blank line, separators that
# str.splitlines knows but the loader does not split at (U+2028, form feed, U+001E, U+0085),
# and no final newline: the loader splits after "\n" only (StringIO.readlines).
CORPUS = ("In the beginning God created the heaven and the earth.\r\n"
          "And the earth was without form, and void;\n"
          "\n"
          "and darkness was upon the face of the deep.\r"
          "And the Spirit of God\u2028moved upon\x0cthe face\x1eof the waters.\u0085"
          "And God said, Let there be light: and there was light.")


def main():
    path = os.path.join(EXPECTED, "lines.txt")
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(CORPUS)
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    rows = datasets.load_dataset("text", data_files=path, keep_linebreaks=True, split="train")
    ids = []
    for text in rows["text"]:
        ids += tok(text)["input_ids"]
    with open(os.path.join(EXPECTED, "lines.ids"), "w") as f:
        f.write(" ".join(map(str, ids)) + "\n")
    print(len(rows), "rows,", len(ids), "ids; datasets", datasets.__version__, "transformers", transformers.__version__)


if __name__ == "__main__":
    main()
