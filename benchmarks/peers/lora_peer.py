"""PEFT on PyTorch eager, timed for `ferry bench lora --peers PYTHON` (benchmarks/bench_lora.cpp).

The model is a transformers LlamaForCausalLM of ferry's bench shape (random weights: the
values do not matter to the time), untied head, no biases, with PEFT's LoRA (get_peft_model,
LoraConfig(r, lora_alpha, target_modules="all-linear", lora_dropout 0)) on every projection
of the blocks, so the trained parameters are ferry's (the answer reports their count for the
caller to compare). With "qlora", the base is loaded as transformers' QLoRA recipe loads it:
BitsAndBytesConfig(load_in_4bit, nf4, double quantization, bfloat16 compute) on the CPU
(bitsandbytes' CPU backend), then prepare_model_for_kbit_training's casts are skipped (they
only matter on a GPU) and the same LoRA is added.

A long-running peer (benchmarks/peer_process.h): prints a ready line with the versions, then
answers one JSON line per request line on stdin:
  {"n_layer": L, "n_head": H, "n_kv_head": K, "n_embd": C, "intermediate": I, "vocab_size": V,
   "block_size": T, "batch": B, "r": R, "alpha": A, "qlora": false|true, "steps": S, "threads": N}
  -> {"seconds": [s, ...], "trainable": P, "loss": first loss}   (or {"error": "..."})
A step is zero_grad, forward with labels (the mean cross-entropy), backward, and AdamW
(lr 1e-4, PyTorch's default implementation) on the adapters: a whole training step. The
first request of a configuration builds the model and runs two untimed steps; later ones
reuse it, so that ferry's rounds and these alternate.
Needs torch, transformers, peft (and bitsandbytes for qlora): scripts/make_peers_env.sh.
"""
import time

from peer_protocol import claim_stdout, serve

_cache = {}


def build(req):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=req["n_embd"], num_hidden_layers=req["n_layer"],
                      num_attention_heads=req["n_head"], num_key_value_heads=req["n_kv_head"],
                      intermediate_size=req["intermediate"], vocab_size=req["vocab_size"],
                      max_position_embeddings=req["block_size"], tie_word_embeddings=False,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    if req.get("qlora"):
        import tempfile

        folder = tempfile.mkdtemp(prefix="ferry-lora-peer-")
        model.save_pretrained(folder)
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16)
        model = LlamaForCausalLM.from_pretrained(folder, quantization_config=quant, device_map="cpu",
                                                 torch_dtype=torch.bfloat16)
    lora = LoraConfig(r=req["r"], lora_alpha=req["alpha"], lora_dropout=0.0, target_modules="all-linear",
                      bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora)
    model.train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, req["vocab_size"], (req["batch"], req["block_size"]), generator=g)
    return model, opt, ids, trainable


def step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return float(loss)


def answer(req):
    import torch

    torch.set_num_threads(int(req["threads"]))
    key = tuple(req[k] for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "intermediate", "vocab_size",
                                 "block_size", "batch", "r", "alpha", "qlora"))
    if key not in _cache:
        model, opt, ids, trainable = build(req)
        first = step(model, opt, ids)
        step(model, opt, ids)
        _cache[key] = (model, opt, ids, trainable, first)
    model, opt, ids, trainable, first = _cache[key]
    seconds = []
    for _ in range(int(req["steps"])):
        t0 = time.perf_counter()
        step(model, opt, ids)
        seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds, "trainable": trainable, "loss": first}


if __name__ == "__main__":
    out = claim_stdout()
    import peft
    import torch
    import transformers

    hello = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__}
    try:
        import bitsandbytes

        hello["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        pass
    serve(out, hello, answer)
