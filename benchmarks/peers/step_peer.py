"""DeepSpeed ZeRO-Infinity on the CPU, timed for `ferry bench step --peers PYTHON`
(benchmarks/bench_step.cpp).

The GPT of ferry's step benchmark in PyTorch (model_peer.make_gpt: ferry's nn/gpt.h tensor
for tensor) under DeepSpeed's ZeRO stage 3 with parameters and optimizer state on NVMe
(offload_param and offload_optimizer "nvme", DeepSpeed's defaults for their buffers, aio at
1 MiB blocks and depth 8 as ferry's), AdamW through DeepSpeed's CPU Adam, gradient clipping
1.0, one process on the CPU accelerator (DS_ACCELERATOR=cpu), torch.set_num_threads and
OMP_NUM_THREADS at the caller's thread count. Its swap files go to the request's nvme_path.

A long-running peer (benchmarks/peer_process.h): prints a ready line with the versions, then
answers one JSON line per request line on stdin:
  {"init": {"n_layer": L, "n_head": H, "n_embd": C, "vocab_size": V, "block_size": T,
            "batch": B, "nvme_path": DIR, "lr": LR, "weight_decay": WD, "warmup": W}}
     -> {"params": P}   (the engine is built and W untimed steps run)
  {"steps": S} -> {"seconds": [S]}   (the wall time of each of S training steps)
or {"error": "..."}. Everything else goes to stderr. Needs torch and deepspeed with its aio
op (scripts/make_peers_env.sh).
"""
import os
import time

from peer_protocol import claim_stdout, serve


def main():
    out = claim_stdout()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")

    import torch
    import deepspeed

    from model_peer import make_gpt  # beside this script, as peer_protocol is

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    state = {}

    def answer(r):
        if "init" in r:
            c = r["init"]
            torch.manual_seed(5)
            model = make_gpt(c["n_layer"], c["n_head"], c["n_embd"], c["vocab_size"], c["block_size"])
            params = sum(p.numel() for p in model.parameters())
            cfg = {"train_micro_batch_size_per_gpu": c["batch"],
                   "gradient_clipping": 1.0,
                   "optimizer": {"type": "AdamW",
                                 "params": {"lr": c["lr"], "weight_decay": c["weight_decay"],
                                            "betas": [0.9, 0.999], "eps": 1e-8}},
                   "zero_optimization": {"stage": 3,
                                         "offload_param": {"device": "nvme", "nvme_path": c["nvme_path"]},
                                         "offload_optimizer": {"device": "nvme", "nvme_path": c["nvme_path"]}},
                   "aio": {"block_size": 1048576, "queue_depth": 8}}
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=cfg)
            B, T = c["batch"], c["block_size"]
            g = torch.Generator().manual_seed(7)
            idx = torch.randint(0, c["vocab_size"], (B, T), generator=g)
            tgt = torch.randint(0, c["vocab_size"], (B, T), generator=g)
            state.update(engine=engine, idx=idx, tgt=tgt)
            for _ in range(int(c.get("warmup", 2))):
                step(state)
            return {"params": params}
        else:
            seconds = []
            for _ in range(int(r["steps"])):
                t0 = time.perf_counter()
                step(state)
                seconds.append(time.perf_counter() - t0)
            return {"seconds": seconds}

    serve(out, {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                "threads": torch.get_num_threads()}, answer)


def step(state):
    engine = state["engine"]
    loss = engine(state["idx"], state["tgt"])
    engine.backward(loss)
    engine.step()
    return loss


if __name__ == "__main__":
    main()
