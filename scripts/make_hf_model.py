#!/usr/bin/env python3
"""A Hugging Face Llama folder of any size, for measuring ferry's loading (model.init_from).

Standard library only: writes config.json and model-0000K-of-0000N.safetensors shards with
model.safetensors.index.json, bf16 weights drawn once (N(0, 0.02), norms 1) and repeated,
so a multi-GB model takes seconds to write. The values are not a trained model's; the
folder exists to load.

  python3 scripts/make_hf_model.py OUT --hidden 1536 --layers 16 --heads 12 --kv-heads 4 \
      --intermediate 4096 --vocab 32000 [--shard-gb 0.5]
"""
import argparse
import json
import os
import random
import struct


def bf16_block(n, std, seed):
    rnd = random.Random(seed)
    out = bytearray()
    for _ in range(n):
        f = struct.pack("<f", rnd.gauss(0.0, std))
        out += f[2:4]  # truncation to bf16 is fine for a load test
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--shard-gb", type=float, default=0.5)
    a = ap.parse_args()
    C, hd = a.hidden, a.hidden // a.heads
    tensors = [("model.embed_tokens.weight", [a.vocab, C])]
    for l in range(a.layers):
        p = f"model.layers.{l}."
        tensors += [(p + "input_layernorm.weight", [C]),
                    (p + "self_attn.q_proj.weight", [C, C]),
                    (p + "self_attn.k_proj.weight", [a.kv_heads * hd, C]),
                    (p + "self_attn.v_proj.weight", [a.kv_heads * hd, C]),
                    (p + "self_attn.o_proj.weight", [C, C]),
                    (p + "post_attention_layernorm.weight", [C]),
                    (p + "mlp.gate_proj.weight", [a.intermediate, C]),
                    (p + "mlp.up_proj.weight", [a.intermediate, C]),
                    (p + "mlp.down_proj.weight", [C, a.intermediate])]
    tensors += [("model.norm.weight", [C]), ("lm_head.weight", [a.vocab, C])]
    limit = int(a.shard_gb * 1e9)
    shards, cur, size = [], [], 0
    for name, shape in tensors:
        n = 2
        for d in shape:
            n *= d
        if cur and size + n > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape, n))
        size += n
    shards.append(cur)
    os.makedirs(a.out, exist_ok=True)
    block = bf16_block(1 << 20, 0.02, 1)
    one = struct.pack("<f", 1.0)[2:4]
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, at = {}, 0
        for name, shape, n in shard:
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [at, at + n]}
            at += n
            weight_map[name] = fname
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for i, (name, shape, n) in enumerate(shard):
                if name.endswith("norm.weight"):
                    f.write(one * (n // 2))
                    continue
                shift = (i * 7919) % len(block) & ~1
                data = block[shift:] + block[:shift]
                while n > 0:
                    w = min(n, len(data))
                    f.write(data[:w])
                    n -= w
        total += at
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
              "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
              "intermediate_size": a.intermediate, "vocab_size": a.vocab, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": None, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{a.out}: {total / 2:.0f} parameters, {total / 1e9:.2f} GB of bf16 in {len(shards)} files")


if __name__ == "__main__":
    main()
