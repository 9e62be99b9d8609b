#!/usr/bin/env python3
"""examples/data/verses.jsonl: a small instruction set made from the bundled corpus, for the
fine-tuning walk-through (docs/guide/data.md). Each record asks for the next
words of a verse's opening: {"prompt": "Gen 1:3: And God said,", "completion": " Let there
be light:"} (the first 6 words, split in half); every 10th record is plain {"text": ...}
(the opening alone), as mixed sets have. Short records, so that several share a row when
packed.
Standard library only; deterministic.

  python3 scripts/make_verses_jsonl.py > examples/data/verses.jsonl
  python3 scripts/make_verses_jsonl.py --chat > examples/data/chat.jsonl

With --chat the same pairs are conversations, {"messages": [{"role": "user", ...},
{"role": "assistant", ...}]}, every tenth with a system message first.
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
    words = line.split(" ")[:6]
    if len(words) < 6:
        continue
    if len(out) % 10 == 9:
        out.append({"text": " ".join(words)})
    else:
        out.append({"prompt": f"{book[:3]} {chapter}:{verse}: " + " ".join(words[:3]),
                    "completion": " " + " ".join(words[3:])})
    if len(out) == 600:
        break
if "--chat" in sys.argv:
    chats = []
    for i, r in enumerate(out):
        user = r.get("prompt", "Say a verse's opening.")
        reply = r.get("completion", " " + r.get("text", "")).strip()
        turns = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        if i % 10 == 0:
            turns.insert(0, {"role": "system", "content": "Continue the verse."})
        chats.append({"messages": turns})
    out = chats
for r in out:
    sys.stdout.write(json.dumps(r, ensure_ascii=False) + "\n")
