#!/usr/bin/env python3
"""examples/data/verses.jsonl: a small instruction set made from the bundled corpus, for the
fine-tuning walk-through (README, "Fine-tuning on JSONL"). Each record asks for the rest of a
verse: {"prompt": "Continue Genesis 1:4: And God saw the light,", "completion": " that it was
good: ..."}. Every 10th record is plain {"text": ...} (a whole verse), as mixed sets have.
Standard library only; deterministic.

  python3 scripts/make_verses_jsonl.py > examples/data/verses.jsonl
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
lines = open(os.path.join(here, "..", "examples", "data", "kjv.txt"), encoding="utf-8").read().splitlines()
book, chapter, verse, out = None, None, 0, []
for line in lines:
    parts = line.split(" ")
    if len(parts) >= 2 and parts[-1].isdigit() and len(line) < 30:  # "Genesis 1": a chapter header
        book, chapter, verse = " ".join(parts[:-1]), parts[-1], 0
        continue
    if not line.strip() or book is None:
        continue
    verse += 1
    words = line.split(" ")
    if len(words) < 6 or len(line) > 70:
        continue
    if len(out) % 10 == 9:
        out.append({"text": line})
    else:
        cut = len(words) // 2
        out.append({"prompt": f"Continue {book} {chapter}:{verse}: " + " ".join(words[:cut]),
                    "completion": " " + " ".join(words[cut:])})
    if len(out) == 600:
        break
for r in out:
    sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")
