"""Hugging Face tokenizers, timed for `ferry bench tokenize --python PYTHON`
(benchmarks/bench_tokenize.cpp).

A long-running peer (benchmarks/peer_process.h): prints a ready line with the version, then
answers one JSON line per request line on stdin:
  {"tokenizer": PATH, "corpus": PATH, "bytes": N, "reps": R}
  -> {"one_mb_s": [R], "batch_mb_s": [R], "ids": I}  (or {"error": "..."})
The first N bytes of the corpus (UTF-8) are split into lines as ferry's benchmark splits them
(at '\n' only, keeping it) and encoded without special tokens: one by one (`encode`), and all
at once (`encode_batch` on RAYON_NUM_THREADS threads, which the caller sets to its own
thread count); MB/s per repetition, and the number of ids. Needs
the tokenizers package (scripts/hf_fixtures/requirements.txt makes such a Python).
"""
import time

from peer_protocol import claim_stdout, serve


def main():
    out = claim_stdout()

    import tokenizers
    from tokenizers import Tokenizer

    def answer(r):
        t = Tokenizer.from_file(r["tokenizer"])
        with open(r["corpus"], "rb") as f:
            data = f.read(int(r["bytes"])).decode("utf-8", errors="ignore")
        lines = data.split("\n")  # as ferry's benchmark: on '\n' only, keeping it
        lines = [s + "\n" for s in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
        n = len(data.encode())

        def rates(fn):
            got = []
            for _ in range(int(r["reps"])):
                t0 = time.perf_counter()
                fn()
                got.append(n / (time.perf_counter() - t0) / 1e6)
            return got

        one = rates(lambda: [t.encode(s, add_special_tokens=False) for s in lines])
        batch = rates(lambda: t.encode_batch(lines, add_special_tokens=False))
        ids = sum(len(e.ids) for e in t.encode_batch(lines, add_special_tokens=False))
        return {"one_mb_s": one, "batch_mb_s": batch, "ids": ids}

    serve(out, {"tokenizers": tokenizers.__version__}, answer)


if __name__ == "__main__":
    main()
