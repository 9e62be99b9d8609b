#!/usr/bin/env python3
"""A tiny model folder shaped like a Llama 3.x Instruct download saved by transformers 5, and
the ids transformers gives for its records, for tests/user_data.sh and tests/test_data.cpp.

Writes tests/data/user_files/models/llama3-instruct/ (see the README there) and
tests/data/user_files/models/expected/. Needs transformers, tokenizers, numpy (no torch):
  python3 -m venv /tmp/venv-fixtures && /tmp/venv-fixtures/bin/pip install transformers tokenizers jinja2 numpy
  /tmp/venv-fixtures/bin/python scripts/user_fixtures/make_llama3_instruct.py
"""
import json
import os
import shutil
import struct

import numpy as np
import tokenizers
import transformers
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests/data/user_files/models")
MODEL = os.path.join(OUT, "llama3-instruct")
EXPECTED = os.path.join(OUT, "expected")

# Llama 3.1/3.2 Instruct's chat template, shortened (no tools, no date): the same header and
# end-of-turn tokens, the BOS the template writes itself.
CHAT = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
TOOL_USE = CHAT.replace("{{- bos_token }}", "{{- bos_token }}{{- 'Tools: ' + (tools | tojson) }}")

RECORDS = [
    {"prompt": "Gen 1:1: In the beginning", "completion": " God created the heaven and the earth."},
    {"prompt": "Question: who divided the light from the darkness?\nAnswer:", "completion": " God."},
    {"text": "And the evening and the morning were the first day."},
    {"messages": [{"role": "system", "content": "Continue the verse."},
                  {"role": "user", "content": "Gen 1:3: And God said,"},
                  {"role": "assistant", "content": "Let there be light: and there was light."}]},
    {"messages": [{"role": "user", "content": "Gen 1:4"},
                  {"role": "assistant", "content": "And God saw the light, that it was good."}]},
]
CORPUS = ("In the beginning God created the heaven and the earth.\n"
          "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
          "And the Spirit of God moved upon the face of the waters.\n")


def bf16_bytes(a):
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()  # round to nearest even


def write_safetensors(path, tensors):
    header, blobs, at = {}, [], 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    shutil.rmtree(MODEL, ignore_errors=True)
    shutil.rmtree(EXPECTED, ignore_errors=True)
    os.makedirs(EXPECTED)
    # The Llama 3 family tokenizer of tests/data/tokenizers/llama3 (post-processor: <|begin_of_text|>
    # before every text) with Llama 3.1's <|eom_id|> added.
    raw = tokenizers.Tokenizer.from_file(os.path.join(ROOT, "tests/data/tokenizers/llama3/tokenizer.json"))
    raw.add_special_tokens([tokenizers.AddedToken("<|eom_id|>", special=True, normalized=False)])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                                  model_max_length=131072, clean_up_tokenization_spaces=True)
    tok.chat_template = {"default": CHAT, "tool_use": TOOL_USE}
    tok.save_pretrained(MODEL)
    assert os.path.exists(os.path.join(MODEL, "chat_template.jinja")), "transformers 5 saves chat_template.jinja"
    tc = json.load(open(os.path.join(MODEL, "tokenizer_config.json")))
    assert "chat_template" not in tc, "transformers 5 keeps the template out of tokenizer_config.json"
    ids = {t: tok.convert_tokens_to_ids(t) for t in ["<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]}
    eos_list = [ids["<|end_of_text|>"], ids["<|eom_id|>"], ids["<|eot_id|>"]]  # Llama 3.1/3.2 Instruct's order
    vocab = 1024  # above the tokenizer's ids, as Llama 3's 128256 is
    hidden, heads, kv, head_dim, inter = 16, 2, 1, 8, 32
    config = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": eos_list, "head_dim": head_dim,
        "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": inter,
        "max_position_embeddings": 128, "mlp_bias": False, "model_type": "llama", "num_attention_heads": heads,
        "num_hidden_layers": 1, "num_key_value_heads": kv, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 32, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": vocab}
    json.dump(config, open(os.path.join(MODEL, "config.json"), "w"), indent=2)
    gen = {"bos_token_id": ids["<|begin_of_text|>"], "do_sample": True, "eos_token_id": eos_list,
           "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0.dev0"}
    json.dump(gen, open(os.path.join(MODEL, "generation_config.json"), "w"), indent=2)
    rng = np.random.default_rng(37)
    def mat(o, i):
        return ([o, i], bf16_bytes(rng.normal(0, 1 / np.sqrt(i), (o, i))))
    def gain(n):
        return ([n], bf16_bytes(1 + 0.1 * rng.normal(size=n)))
    t = {"model.embed_tokens.weight": ([vocab, hidden], bf16_bytes(rng.normal(0, 0.2, (vocab, hidden)))),
         "model.layers.0.input_layernorm.weight": gain(hidden),
         "model.layers.0.self_attn.q_proj.weight": mat(heads * head_dim, hidden),
         "model.layers.0.self_attn.k_proj.weight": mat(kv * head_dim, hidden),
         "model.layers.0.self_attn.v_proj.weight": mat(kv * head_dim, hidden),
         "model.layers.0.self_attn.o_proj.weight": mat(hidden, heads * head_dim),
         "model.layers.0.post_attention_layernorm.weight": gain(hidden),
         "model.layers.0.mlp.gate_proj.weight": mat(inter, hidden),
         "model.layers.0.mlp.up_proj.weight": mat(inter, hidden),
         "model.layers.0.mlp.down_proj.weight": mat(hidden, inter),
         "model.norm.weight": gain(hidden)}
    write_safetensors(os.path.join(MODEL, "model.safetensors"), t)

    # What the Hugging Face stack gives for each record (transformers reloads the folder).
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    assert tok.eos_token == "<|eot_id|>" and tok.get_chat_template() == CHAT
    eos = tok.eos_token_id
    lines, expected = [], []
    for r in RECORDS:
        lines.append(json.dumps(r))
        if "messages" in r:
            # apply_chat_template tokenizes the rendering without adding special tokens.
            rendered = tok.apply_chat_template(r["messages"], tokenize=False)
            rec = tok(rendered, add_special_tokens=False)["input_ids"]
        elif "prompt" in r:
            # The prompt as tokenizer(prompt) encodes it (BOS from the post-processor), the
            # completion without special tokens, then tokenizer.eos_token_id, as TRL's SFT
            # tokenization of prompt-completion records gives (checked on the joined text).
            rec = tok(r["prompt"])["input_ids"] + tok(r["completion"], add_special_tokens=False)["input_ids"] + [eos]
            assert rec == tok(r["prompt"] + r["completion"] + tok.eos_token)["input_ids"]
        else:
            rec = tok(r["text"])["input_ids"] + [eos]
        expected.append(rec)
    open(os.path.join(EXPECTED, "records.jsonl"), "w").write("\n".join(lines) + "\n")
    open(os.path.join(EXPECTED, "records.ids"), "w").write("\n".join(" ".join(map(str, r)) for r in expected) + "\n")
    open(os.path.join(EXPECTED, "corpus.txt"), "w").write(CORPUS)
    open(os.path.join(EXPECTED, "corpus.ids"), "w").write(" ".join(map(str, tok(CORPUS)["input_ids"])) + "\n")
    print("transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "ids", ids)


if __name__ == "__main__":
    main()
