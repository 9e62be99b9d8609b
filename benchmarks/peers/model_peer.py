"""PyTorch eager on ferry's GPT, timed for `ferry bench model --peers PYTHON` (benchmarks/bench_model.cpp).

The model is ferry's nn::GPT written in PyTorch, tensor for tensor (nn/gpt.h): token and
position embeddings, pre-LayerNorm blocks (causal self-attention through
scaled_dot_product_attention, a 4x GELU-tanh MLP, every Linear with a bias), a final
LayerNorm and the head tied to the token embedding; so the parameter count is ferry's, which
the answer reports for the caller to compare. Initialisation is GPT-2's (N(0, 0.02)); the
values do not matter to the time.

A long-running peer (benchmarks/peer_process.h): prints a ready line with the versions, then
answers one JSON line per request line on stdin:
  {"n_layer": L, "n_head": H, "n_embd": C, "vocab_size": V, "block_size": T, "batch": B,
   "tokens": [...], "targets": [...], "steps": S, "threads": N, "optimizer": false|true}
  -> {"seconds_per_step": s, "params": P, "loss": first loss}  (or {"error": "..."})
fp32 on the CPU. A step is zero_grad, forward with the mean cross-entropy, backward; with
"optimizer" also clip_grad_norm_(1.0) and AdamW (lr 3e-4, weight decay 0.1, PyTorch's
default implementation: on CPU tensors the per-parameter loop), which is a whole training
step. The first request of a shape builds the model and runs one untimed step (first touch of the activations, the allocator's caches;
its loss is the answer's "loss", about ln V at GPT-2's initialisation); later requests
of the same shape reuse it, so that ferry's repetitions and these alternate.
With "ranks": R > 1 the request is a whole training step under FSDP2 (fully_shard on every
block and the root) over gloo at R spawned processes of "threads" threads each, every rank
on the same tokens; two untimed steps, then "steps" timed ones between barriers; the answer
is rank 0's (a fresh set of processes per request).
Everything else goes to stderr. Needs torch (scripts/make_peers_env.sh makes such a Python).
"""
import os
import time

from peer_protocol import claim_stdout, serve


def make_gpt(L, H, C, V, T):
    """ferry's nn::GPT in PyTorch (nn/gpt.h), GPT-2's initialisation."""
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, C, H):
            super().__init__()
            self.H = H
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
            return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))

    return GPT()


def fsdp_worker(rank, world, port, r, queue):
    """One rank of the FSDP2 run: each block and the root under fully_shard, gloo, the
    request's shape and threads; rank 0 puts the seconds per step on `queue`."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(int(r["threads"]))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.manual_seed(5)
        B, T = r["batch"], r["block_size"]
        model = make_gpt(r["n_layer"], r["n_head"], r["n_embd"], r["vocab_size"], T)
        params = sum(p.numel() for p in model.parameters())
        # A CPU mesh: without one, fully_shard takes the accelerator's (PyPI's torch has CUDA).
        mesh = init_device_mesh("cpu", (world,))
        for b in model.blocks:
            fully_shard(b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        idx = torch.tensor(r["tokens"], dtype=torch.int64).view(B, T)
        tgt = torch.tensor(r["targets"], dtype=torch.int64).view(B, T)

        def step():
            model.zero_grad(set_to_none=True)
            loss = model(idx, tgt)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss

        loss = step().item()  # untimed, twice: the first allocates the optimizer's state
        step()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(int(r["steps"])):
            step()
        dist.barrier()
        seconds = (time.perf_counter() - t0) / int(r["steps"])
        if rank == 0:
            queue.put({"seconds_per_step": seconds, "loss": loss, "params": params})
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001: quoted by the caller
        queue.put({"error": "rank %d: %s: %s" % (rank, type(e).__name__, e)})


def run_fsdp(r):
    """FSDP2 over gloo at r["ranks"] processes on this machine (spawned: a fresh
    interpreter each, as torchrun would start them)."""
    import multiprocessing as mp
    import queue as queue_mod
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    world = int(r["ranks"])
    procs = [ctx.Process(target=fsdp_worker, args=(k, world, port, r, q)) for k in range(world)]
    for p in procs:
        p.start()
    try:
        answer = q.get(timeout=600)
    except queue_mod.Empty:
        answer = {"error": "no answer from the FSDP2 ranks in 600 s"}
    for p in procs:
        p.join(timeout=60 if "error" not in answer else 5)
        if p.is_alive():
            p.kill()
    return answer


def main():
    out = claim_stdout()

    import torch

    built = {}

    def answer(r):
        if int(r.get("ranks", 1)) > 1:
            return run_fsdp(r)
        torch.set_num_threads(int(r["threads"]))
        key = (r["n_layer"], r["n_head"], r["n_embd"], r["vocab_size"], r["block_size"], r["batch"],
               bool(r.get("optimizer", False)))
        B, T = r["batch"], r["block_size"]
        idx = torch.tensor(r["tokens"], dtype=torch.int64).view(B, T)
        tgt = torch.tensor(r["targets"], dtype=torch.int64).view(B, T)

        if key not in built:
            built.clear()  # one model at a time: the next shape frees the last
            torch.manual_seed(5)
            model = make_gpt(r["n_layer"], r["n_head"], r["n_embd"], r["vocab_size"], T)
            opt = (torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
                   if r.get("optimizer") else None)
            built[key] = [model, opt, None]
        model, opt, first = built[key]

        def step():
            model.zero_grad(set_to_none=True)
            loss = model(idx, tgt)
            loss.backward()
            if opt is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            return loss

        if first is None:
            first = built[key][2] = step().item()  # untimed
        t0 = time.perf_counter()
        for _ in range(int(r["steps"])):
            step()
        seconds = (time.perf_counter() - t0) / int(r["steps"])
        return {"seconds_per_step": seconds, "loss": first,
                "params": sum(p.numel() for p in model.parameters())}

    serve(out, {"torch": torch.__version__, "mkl": torch.backends.mkl.is_available(),
                "mkldnn": torch.backends.mkldnn.is_available()}, answer)


if __name__ == "__main__":
    main()
