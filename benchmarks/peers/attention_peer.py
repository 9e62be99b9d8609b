"""PyTorch's scaled_dot_product_attention, timed for `ferry bench attention --python PYTHON`
(benchmarks/bench_attention.cpp).

The shapes of ferry's benchmark: B = 8192 / T sequences of T tokens, 12 heads of 64, causal,
on "device" in fp32 or bf16, torch.set_num_threads("threads") on the CPU. A long-running
peer (benchmarks/peer_process.h): prints a ready line with the versions, then answers one
JSON line per request line on stdin:
  {"T": T, "device": "cpu"|"cuda", "bf16": false|true, "threads": N, "reps": R}
  -> {"fwd_ms": [R], "bwd_ms": [R]}  (or {"error": "..."})
The first request of a shape allocates q, k, v and runs one untimed forward and backward;
later requests reuse them, so that ferry's repetitions and these alternate. Everything else
goes to stderr. Needs torch (scripts/make_peers_env.sh makes such a Python).
"""
import time

from peer_protocol import claim_stdout, serve


def main():
    out = claim_stdout()

    import torch
    import torch.nn.functional as F

    cache = {}

    def answer(r):
        dev = r.get("device", "cpu")
        if int(r.get("threads", 0)) > 0:
            torch.set_num_threads(int(r["threads"]))
        dt = torch.bfloat16 if r.get("bf16") else torch.float32
        T = int(r["T"])

        def sync():
            if dev == "cuda":
                torch.cuda.synchronize()

        def once(q, k, v, g):
            sync()
            t0 = time.perf_counter()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            sync()
            t1 = time.perf_counter()
            o.backward(g)
            sync()
            t2 = time.perf_counter()
            q.grad = k.grad = v.grad = None
            return t1 - t0, t2 - t1

        key = (T, dev, str(dt))
        if key not in cache:
            cache.clear()
            B = max(1, 8192 // T)
            q, k, v = [torch.randn(B, 12, T, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
            g = torch.randn(B, 12, T, 64, device=dev, dtype=dt)
            cache[key] = (q, k, v, g)
            once(q, k, v, g)  # untimed
        fwd, bwd = [], []
        for _ in range(int(r["reps"])):
            f, b = once(*cache[key])
            fwd.append(1e3 * f)
            bwd.append(1e3 * b)
        return {"fwd_ms": fwd, "bwd_ms": bwd}

    serve(out, {"torch": torch.__version__}, answer)


if __name__ == "__main__":
    main()
