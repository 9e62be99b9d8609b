#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora, tests/fuzz/corpus/<target>/, from tests/data and
examples (small valid inputs, and slightly broken ones that reach each refusal).

Python's standard library only; the seeds are committed, so neither CI nor `make test-fuzz`
runs this. It overwrites the files it writes and leaves any other file there (regression
inputs added by hand). Several-file inputs are joined by fuzz_util.h's separator.
Usage: python3 tests/fuzz/make_corpus.py
"""
import json
import os
import random
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")
SEP = b"\n--8<--\n"


def read(rel):
    with open(os.path.join(ROOT, rel), "rb") as f:
        return f.read()


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def parts(*files):
    return SEP.join(b"" if f is None else (f.encode() if isinstance(f, str) else f) for f in files)


def compact(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --- ferry's configuration and DeepSpeed files ------------------------------------------

def config_seeds():
    for name in sorted(os.listdir(os.path.join(ROOT, "examples", "configs"))):
        put("fuzz_config", name, read("examples/configs/" + name))
    tiny = json.loads(read("examples/configs/tiny.json"))
    put("fuzz_config", "bad-truncated.json", read("examples/configs/tiny.json")[:200])
    put("fuzz_config", "bad-unknown-key.json", compact({**tiny, "model": {**tiny["model"], "n_layers": 4}}))
    put("fuzz_config", "bad-type.json", compact({**tiny, "train": {"steps": "600"}}))
    put("fuzz_config", "bad-range.json", compact({**tiny, "model": {**tiny["model"], "n_head": 0}}))
    put("fuzz_config", "bytes-and-comments.json",
        '// a comment\n{"model": {"preset": "llama-tiny"}, "device": {"memory": "1.5GiB"},\n'
        ' /* offload */ "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},'
        ' "offload_optimizer": {"device": "nvme", "nvme_path": "a,b"}}, "bf16": {"enabled": true}}')
    put("fuzz_config", "preset-and-init.json", compact({"model": {"preset": "gpt2-small", "init_from": "hf"}}))
    put("fuzz_config", "fp16.json", compact({**tiny, "fp16": {"enabled": True, "loss_scale": 0,
                                                             "initial_scale_power": 16, "hysteresis": 2}}))
    # Regressions (each found by the fuzzer; tests/test_config.cpp checks the message).
    put("fuzz_config", "regress-number-overflow.json", '{"data": {"path": "c.txt"}, "train": {"steps": 1e999}}')
    put("fuzz_config", "regress-int-field.json", compact({**tiny, "checkpoint": {"keep_last": 1 << 40}}))
    put("fuzz_config", "regress-huge-model.json", compact({**tiny, "model": {**tiny["model"], "n_embd": 1 << 40,
                                                                            "n_head": 1}}))


def deepspeed_seeds():
    for name in sorted(os.listdir(os.path.join(ROOT, "examples", "deepspeed"))):
        put("fuzz_deepspeed", name, read("examples/deepspeed/" + name))
    z2 = json.loads(read("examples/deepspeed/zero2_cpu_offload.json"))
    put("fuzz_deepspeed", "bad-amp.json", compact({**z2, "amp": {"enabled": True}}))
    put("fuzz_deepspeed", "bad-optimizer.json", compact({**z2, "optimizer": {"type": "Lamb", "params": {}}}))
    put("fuzz_deepspeed", "bad-batch.json", compact({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2,
                                                     "gradient_accumulation_steps": 2}))
    put("fuzz_deepspeed", "fp16-auto.json", compact({"fp16": {"enabled": "auto", "loss_scale_window": 500},
                                                     "train_batch_size": "auto", "gradient_clipping": "auto",
                                                     "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto",
                                                                           "reduce_bucket_size": "auto"}}))
    put("fuzz_deepspeed", "bad-json.json", b'{"zero_optimization": {"stage": 2,}')
    put("fuzz_deepspeed", "regress-bucket-2e81.json", '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 2e81}}')


# --- checkpoints ------------------------------------------------------------------------

def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


CRC_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def checkpoint(world=2, units=None, seed=1, trained=None):
    """A ferry checkpoint as checkpoint.cpp writes it: (manifest, [(index, data)] per rank).
    trained: per unit, the trainable span's length (format 2: the data holds that span)."""
    rng = random.Random(seed)
    units = units or [("embedding", [("wte", [8, 4]), ("wpe", [4, 4])]),
                      ("block.0", [("h.0.ln_1.weight", [4]), ("h.0.attn.c_proj.weight", [4, 4])]),
                      ("final", [("ln_f.weight", [4])])]
    layout = []
    for name, tensors in units:
        at, ts = 0, []
        for tname, shape in tensors:
            n = 1
            for d in shape:
                n *= d
            ts.append({"name": tname, "shape": shape, "offset": at, "decay": len(shape) > 1})
            at += n
        layout.append({"name": name, "numel": at, "tensors": ts})
    manifest = {"format": "ferry-checkpoint", "format_version": 1, "ferry_version": "0.3.0", "step": 1,
                "world_size": world, "stage": 3,
                "model": {"arch": "gpt2", "n_layer": 1, "n_head": 1, "n_embd": 4, "vocab_size": 8, "block_size": 4},
                "trainer": {"data": {"sequences_consumed": 8}, "lr": 0.001}, "units": layout}
    ranks = []
    for r in range(world):
        data, segments = b"", []
        for u, unit in enumerate(layout):
            span = trained[u] if trained else unit["numel"]
            shard = -(-span // world)
            begin = min(r * shard, span)
            count = max(0, min(span, (r + 1) * shard) - begin)
            for a in range(3):
                values = struct.pack("<%df" % count, *[rng.uniform(-1, 1) for _ in range(count)])
                segments.append({"unit": u, "array": a, "begin": begin if count else 0, "count": count,
                                 "offset": len(data), "crc32c": crc32c(values)})
                data += values
        ranks.append(({"rank": r, "world_size": world, "bytes": len(data), "segments": segments}, data))
    return manifest, ranks


def checkpoint_input(manifest, ranks, latest="step-00000001", drop=()):
    files = [latest, compact(manifest)]
    for r in range(2):
        if r < len(ranks):
            index, data = ranks[r]
            files += [None if (r, "json") in drop else compact(index), None if (r, "bin") in drop else data]
        else:
            files += [None, None]
    return parts(*files)


def checkpoint_seeds():
    m, ranks = checkpoint()
    put("fuzz_checkpoint", "world2", checkpoint_input(m, ranks))
    m1, ranks1 = checkpoint(world=1, seed=2)
    put("fuzz_checkpoint", "world1", checkpoint_input(m1, ranks1, latest="step-00000001\n"))
    put("fuzz_checkpoint", "bad-missing-rank1", checkpoint_input(m, ranks, drop={(1, "json"), (1, "bin")}))
    put("fuzz_checkpoint", "bad-truncated-bin", checkpoint_input(m, [ranks[0], (ranks[1][0], ranks[1][1][:-8])]))
    bad_crc = json.loads(json.dumps(ranks[0][0]))
    bad_crc["segments"][1]["crc32c"] ^= 1
    put("fuzz_checkpoint", "bad-crc", checkpoint_input(m, [(bad_crc, ranks[0][1]), ranks[1]]))
    v2 = dict(m, format_version=2)
    put("fuzz_checkpoint", "bad-version", checkpoint_input(v2, ranks))
    put("fuzz_checkpoint", "bad-latest", checkpoint_input(m, ranks, latest="step-00000009"))
    gap = json.loads(json.dumps(ranks[1][0]))
    gap["segments"][0]["begin"] += 1
    put("fuzz_checkpoint", "bad-tiling", checkpoint_input(m, [ranks[0], (gap, ranks[1][1])]))
    # Regressions (tests/test_checkpoint.cpp, damaged_indexes_and_manifests_are_refused_when_opened).
    put("fuzz_checkpoint", "regress-world-huge", checkpoint_input(dict(m, world_size=1 << 30), ranks))
    flt = json.loads(json.dumps(ranks[0][0]))
    flt["segments"][1]["crc32c"] = 4.2e135
    put("fuzz_checkpoint", "regress-float-crc", checkpoint_input(m, [(flt, ranks[0][1]), ranks[1]]))
    far = json.loads(json.dumps(ranks[0][0]))
    far["segments"][0]["count"] = 2 ** 63 - 1
    put("fuzz_checkpoint", "regress-count-overflow", checkpoint_input(m, [(far, ranks[0][1]), ranks[1]]))
    no_offset = json.loads(json.dumps(m))
    del no_offset["units"][0]["tensors"][0]["offset"]
    put("fuzz_checkpoint", "regress-tensor-no-offset", checkpoint_input(no_offset, ranks))
    put("fuzz_checkpoint", "regress-latest-path", checkpoint_input(m, ranks, latest="/" + "x" * 5000))
    # QLoRA (format 2): block.0's projection frozen and stored in NF4, its extent its blob's
    # (nn/nf4_blob.h: a [4, 4] double-quantized matrix takes 1088 bytes, 544 elements, at 16).
    q, qranks = checkpoint(trained=[48, 4, 4])
    q["format_version"] = 2
    q["units"][1]["tensors"][1].update({"offset": 16, "trainable": False,
                                         "nf4": {"pieces": [[0, 4]], "double_quant": True}})
    q["units"][1]["numel"] = 16 + 544
    for u, t in zip(q["units"], [48, 4, 4]):
        u["trainable_numel"] = t
    put("fuzz_checkpoint", "nf4-frozen", checkpoint_input(q, qranks))


# --- safetensors and Hugging Face folders ------------------------------------------------

def f32(values):
    return struct.pack("<%df" % len(values), *values)


def bf16(values):
    return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:] for v in values)


def f16(values):
    return struct.pack("<%de" % len(values), *values)


def safetensors(tensors, dtype="F32", metadata=None, seed=0):
    """tensors: [(name, shape)]; values drawn from `seed`."""
    rng = random.Random(seed)
    enc, size = {"F32": (f32, 4), "BF16": (bf16, 2), "F16": (f16, 2)}[dtype]
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, shape in tensors:
        n = 1
        for d in shape:
            n *= d
        blob = enc([round(rng.uniform(-0.5, 0.5), 3) for _ in range(n)])
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = compact(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


C, V, P, NH, KVH, I = 4, 8, 4, 2, 1, 6


def gpt2_tensors():
    t = [("transformer.wte.weight", [V, C]), ("transformer.wpe.weight", [P, C])]
    h = "transformer.h.0."
    t += [(h + "ln_1.weight", [C]), (h + "ln_1.bias", [C]), (h + "attn.c_attn.weight", [C, 3 * C]),
          (h + "attn.c_attn.bias", [3 * C]), (h + "attn.c_proj.weight", [C, C]), (h + "attn.c_proj.bias", [C]),
          (h + "ln_2.weight", [C]), (h + "ln_2.bias", [C]), (h + "mlp.c_fc.weight", [C, 4 * C]),
          (h + "mlp.c_fc.bias", [4 * C]), (h + "mlp.c_proj.weight", [4 * C, C]), (h + "mlp.c_proj.bias", [C]),
          ("transformer.ln_f.weight", [C]), ("transformer.ln_f.bias", [C])]
    return t


def llama_tensors(biases=False, tied=False):
    hd = C // NH
    p = "model.layers.0."
    t = [("model.embed_tokens.weight", [V, C]), (p + "input_layernorm.weight", [C]),
         (p + "self_attn.q_proj.weight", [C, C]), (p + "self_attn.k_proj.weight", [KVH * hd, C]),
         (p + "self_attn.v_proj.weight", [KVH * hd, C]), (p + "self_attn.o_proj.weight", [C, C]),
         (p + "post_attention_layernorm.weight", [C]), (p + "mlp.gate_proj.weight", [I, C]),
         (p + "mlp.up_proj.weight", [I, C]), (p + "mlp.down_proj.weight", [C, I]), ("model.norm.weight", [C])]
    if biases:
        t += [(p + "self_attn.q_proj.bias", [C]), (p + "self_attn.k_proj.bias", [KVH * hd]),
              (p + "self_attn.v_proj.bias", [KVH * hd])]
    if not tied:
        t.append(("lm_head.weight", [V, C]))
    return t


def gpt2_config():
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 1, "n_head": NH, "n_embd": C,
            "vocab_size": V, "n_positions": P, "n_inner": None, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-05, "tie_word_embeddings": True, "torch_dtype": "float32"}


def llama_config(arch="LlamaForCausalLM", **extra):
    c = {"architectures": [arch], "model_type": "llama", "hidden_size": C, "num_hidden_layers": 1,
         "num_attention_heads": NH, "num_key_value_heads": KVH, "head_dim": C // NH, "intermediate_size": I,
         "vocab_size": V, "max_position_embeddings": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
         "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32"}
    c.update(extra)
    return c


def hf_input(config, index=None, shard1=None, shard2=None, single=None):
    return parts(compact(config), None if index is None else compact(index), shard1, shard2, single)


def sharded(tensors, dtype="F32"):
    half = len(tensors) // 2
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"metadata": {"total_size": 0},
             "weight_map": {n: names[0 if i < half else 1] for i, (n, _) in enumerate(tensors)}}
    return index, safetensors(tensors[:half], dtype, seed=1), safetensors(tensors[half:], dtype, seed=2)


def safetensors_seeds():
    put("fuzz_safetensors", "gpt2", safetensors(gpt2_tensors(), metadata={"format": "pt"}))
    put("fuzz_safetensors", "llama-bf16", safetensors(llama_tensors(), "BF16"))
    put("fuzz_safetensors", "f16-empty-tensor", safetensors([("a", [2, 3]), ("empty", [0, 5]), ("b", [1])], "F16"))
    good = safetensors([("x", [2, 2]), ("y", [3])])
    put("fuzz_safetensors", "bad-truncated", good[:-4])
    put("fuzz_safetensors", "bad-header-length", struct.pack("<Q", 1 << 40) + good[8:])
    hdr = b'{"x":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}'
    put("fuzz_safetensors", "bad-offsets", struct.pack("<Q", len(hdr)) + hdr + b"\0" * 12)
    hdr = b'{"x":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}}'
    put("fuzz_safetensors", "bad-dtype", struct.pack("<Q", len(hdr)) + hdr + b"\0" * 2)
    hdr = b'{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,1.92e210]}}'
    put("fuzz_safetensors", "regress-float-offset", struct.pack("<Q", len(hdr)) + hdr + b"\0" * 4)


def hf_seeds():
    put("fuzz_hf_folder", "gpt2-single", hf_input(gpt2_config(), single=safetensors(gpt2_tensors())))
    idx, s1, s2 = sharded(llama_tensors())
    put("fuzz_hf_folder", "llama-sharded", hf_input(llama_config(), idx, s1, s2))
    idx, s1, s2 = sharded(llama_tensors(tied=True), "BF16")
    put("fuzz_hf_folder", "llama-tied-bf16-rope3",
        hf_input(llama_config(tie_word_embeddings=True, torch_dtype="bfloat16",
                              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 4}),
                 idx, s1, s2))
    put("fuzz_hf_folder", "qwen2-f16",
        hf_input(llama_config("Qwen2ForCausalLM", model_type="qwen2", use_sliding_window=False, sliding_window=4096),
                 single=safetensors(llama_tensors(biases=True), "F16")))
    put("fuzz_hf_folder", "mistral-rope-params",
        hf_input(llama_config("MistralForCausalLM", model_type="mistral", sliding_window=None,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                 single=safetensors(llama_tensors())))
    # Refusals: a tensor missing, a wrong shape, one too many, an index naming no file, a
    # config ferry does not compute.
    put("fuzz_hf_folder", "bad-missing-tensor", hf_input(gpt2_config(), single=safetensors(gpt2_tensors()[:-1])))
    wrong = [(n, [s[0] + 1] + s[1:]) if n.endswith("wpe.weight") else (n, s) for n, s in gpt2_tensors()]
    put("fuzz_hf_folder", "bad-shape", hf_input(gpt2_config(), single=safetensors(wrong)))
    put("fuzz_hf_folder", "bad-extra-tensor",
        hf_input(llama_config(), single=safetensors(llama_tensors() + [("model.layers.0.self_attn.q_proj.bias", [C])])))
    idx, s1, s2 = sharded(llama_tensors())
    idx["weight_map"]["lm_head.weight"] = "model-00003-of-00002.safetensors"
    put("fuzz_hf_folder", "bad-index-file", hf_input(llama_config(), idx, s1, s2))
    put("fuzz_hf_folder", "bad-config", hf_input(llama_config(hidden_act="gelu", attention_bias=True),
                                                 single=safetensors(llama_tensors())))
    put("fuzz_hf_folder", "regress-huge-vocab", hf_input(llama_config(vocab_size=1 << 40), single=safetensors(llama_tensors())))


# --- data: token files and JSONL -----------------------------------------------------------

def tokens_seeds():
    rng = random.Random(3)
    ids = [rng.randrange(1000) for _ in range(200)]
    u16 = struct.pack("<%dH" % len(ids), *ids)
    u32 = struct.pack("<%dI" % len(ids), *ids)
    put("fuzz_tokens", "file-uint16", b"0" + u16)
    put("fuzz_tokens", "file-uint32", b"1" + u32)
    put("fuzz_tokens", "bad-odd-size", b"0" + u16[:-1])
    put("fuzz_tokens", "bad-id-above-vocab", b"0" + struct.pack("<%dH" % 40, *([5] * 39 + [60000])))
    put("fuzz_tokens", "folder-of-bins", b"2" + parts(u16[:120], u16[120:300], u16[300:]))
    put("fuzz_tokens", "folder-empty", b"2")
    stream_meta = {"format": "ferry-tokens", "dtype": "uint32", "tokens": len(ids), "records": False, "source": "x"}
    put("fuzz_tokens", "tokenized-stream", b"3" + parts(compact(stream_meta), u32))
    starts = [0]
    while starts[-1] < len(ids):
        starts.append(min(len(ids), starts[-1] + rng.randrange(3, 30)))
    counted = bytes(rng.randrange(2) for _ in ids)
    rec_meta = dict(stream_meta, records=True, record_count=len(starts) - 1)
    st = struct.pack("<%dQ" % len(starts), *starts)
    put("fuzz_tokens", "tokenized-records", b"3" + parts(compact(rec_meta), u32, counted, st))
    bad = list(starts)
    bad[3], bad[4] = bad[4], bad[3]
    put("fuzz_tokens", "bad-starts-order",
        b"3" + parts(compact(rec_meta), u32, counted, struct.pack("<%dQ" % len(bad), *bad)))
    put("fuzz_tokens", "bad-counted-size", b"3" + parts(compact(rec_meta), u32, counted[:-3], st))
    put("fuzz_tokens", "bad-meta", b"3" + parts('{"format": "other"}', u32))
    put("fuzz_tokens", "regress-meta-types", b"3" + parts('{"format": 7, "records": "yes"}', u32))


def jsonl_seeds():
    verses = read("examples/data/verses.jsonl").split(b"\n")
    chat = read("examples/data/chat.jsonl").split(b"\n")
    put("fuzz_jsonl", "verses.seed", b"\n".join(verses[:12]) + b"\n")
    put("fuzz_jsonl", "chat.seed", b"\n".join(chat[:8]) + b"\n")
    put("fuzz_jsonl", "text.seed", b"\n".join(compact({"text": t}).encode() for t in [
        "In the beginning God created the heaven and the earth.", "caf\u00e9 \u4e2d\u6587 \U0001F600 <|eos|> x",
        "  spaces   and\ttabs", "And God said, Let there be light: and there was light.", "12:24 -- 2024"]) + b"\n")
    put("fuzz_jsonl", "mixed.seed", b"\n".join([verses[0], chat[0], b"", b"   ", compact({"text": "Amen."}).encode(),
                                                verses[1], chat[1]]))
    put("fuzz_jsonl", "bad-not-object.seed", verses[0] + b"\n[1, 2]\n")
    put("fuzz_jsonl", "bad-field-type.seed", verses[0] + b'\n{"prompt": 3, "completion": "x"}\n')
    put("fuzz_jsonl", "bad-last-turn.seed",
        verses[0] + b'\n{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}\n')
    put("fuzz_jsonl", "bad-no-fields.seed", verses[0] + b'\n{"input": "x"}\n')


# --- tokenizer.json and chat templates --------------------------------------------------

def shrink_tokenizer(doc, keep_ids=320, keep_merges=120):
    """The same structure with a vocabulary cut to its first ids and the merges among them."""
    model = doc["model"]
    added = {a["content"] for a in doc.get("added_tokens", [])}
    vocab = {t: i for t, i in model["vocab"].items() if i < keep_ids or t in added}
    merges = []
    for m in model.get("merges", []):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
        if len(merges) >= keep_merges:
            break
    model["vocab"], model["merges"] = vocab, merges
    return doc


def tokenizer_seeds():
    put("fuzz_tokenizer", "hf-llama3.json", compact(json.loads(read("tests/data/hf/llama3/tokenizer.json"))))
    for fam in ["gpt2", "llama2", "llama3", "mistral", "qwen2"]:
        doc = shrink_tokenizer(json.loads(read("tests/data/tokenizers/%s/tokenizer.json" % fam)))
        put("fuzz_tokenizer", fam + ".json", compact(doc))
    doc = json.loads(read("tests/data/hf/llama3/tokenizer.json"))
    put("fuzz_tokenizer", "bad-wordpiece.json", compact(dict(doc, model={"type": "WordPiece", "vocab": {"a": 0}})))
    put("fuzz_tokenizer", "bad-no-model.json", compact({k: v for k, v in doc.items() if k != "model"}))
    put("fuzz_tokenizer", "bad-merge.json",
        compact(dict(doc, model=dict(doc["model"], merges=["nothere x"] + doc["model"]["merges"][:3]))))
    added = [dict(a, special=1) for a in doc["added_tokens"]]
    put("fuzz_tokenizer", "regress-special-number.json", compact(dict(doc, added_tokens=added)))
    put("fuzz_tokenizer", "bad-added-id.json",
        compact(dict(doc, added_tokens=doc["added_tokens"] + [{"id": 100000, "content": "<x>", "special": True}])))


def chat_template_seeds():
    d = os.path.join(ROOT, "tests", "data", "chat_templates")
    for name in sorted(os.listdir(d)):
        if not name.endswith(".json"):
            continue
        doc = json.loads(read("tests/data/chat_templates/" + name))
        if "template" in doc:
            put("fuzz_chat_template", name[:-5] + ".jinja", doc["template"])
        for i, s in enumerate(doc.get("snippets", [])):
            put("fuzz_chat_template", "snippet-%02d.jinja" % i, s["template"])
    put("fuzz_chat_template", "walkthrough.jinja", read("examples/data/chat_template.jinja"))
    chatml = json.loads(read("tests/data/chat_templates/chatml.json"))["template"]
    put("fuzz_chat_template", "tokenizer_config-string.json",
        compact({"bos_token": "<s>", "eos_token": "</s>", "chat_template": chatml}))
    put("fuzz_chat_template", "tokenizer_config-list.json",
        compact({"chat_template": [{"name": "default", "template": chatml}, {"name": "tool_use", "template": "{{ 1 }}"}]}))
    put("fuzz_chat_template", "bad-macro.jinja", "{% macro m() %}x{% endmacro %}{{ m() }}")
    put("fuzz_chat_template", "bad-unclosed.jinja", "{% for m in messages %}{{ m.content }}")
    put("fuzz_chat_template", "raise.jinja", "{% if messages|length > 3 %}{{ raise_exception('too long') }}{% endif %}")
    put("fuzz_chat_template", "regress-float-literals.jinja", "{{ 1e999 }} {{ -1.5e999 }} {{ 1.5e-999 }}")
    put("fuzz_chat_template", "regress-int-overflow.jinja", "{{ 3 ** 39 * 3 }}{{ 1 ** 1000000000000000000 }}")
    put("fuzz_chat_template", "regress-nested-loops.jinja",
        "{% for a in 'x' * 1000 %}{% for b in 'y' * 1000 %}{{ loop.index }}{% endfor %}{% endfor %}")
    put("fuzz_chat_template", "regress-doubling.jinja",
        "{% set ns = namespace(s='ab') %}{% for x in [0] * 40 %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}")


# --- FSDP / accelerate files beside ferry's (ferry train --fsdp) --------------------------

def fsdp_seeds():
    for name in sorted(os.listdir(os.path.join(ROOT, "examples", "fsdp"))):
        put("fuzz_fsdp", name, read("examples/fsdp/" + name))
    trainer = json.loads(read("examples/fsdp/fsdp_config.json"))
    acc = read("examples/fsdp/accelerate_fsdp.yaml").decode()
    # The Trainer's --fsdp string form (not a file).
    put("fuzz_fsdp", "string-full-offload.txt", "full_shard auto_wrap offload")
    put("fuzz_fsdp", "string-hybrid-zero2.txt", "hybrid_shard_zero2 auto_wrap")
    put("fuzz_fsdp", "bad-string-two-strategies.txt", "full_shard shard_grad_op")
    # accelerate's YAML without the fsdp_ prefix, numbers for names, flags as strings.
    put("fuzz_fsdp", "accelerate-no-prefix.yaml",
        "distributed_type: FSDP\nmixed_precision: 'no'\nnum_processes: 2\nfsdp_config:\n"
        "  sharding_strategy: 2\n  offload_params: 'true'\n  backward_prefetch: NO_PREFETCH\n"
        "  forward_prefetch: true\n  reshard_after_forward: false\n  state_dict_type: FULL_STATE_DICT\n"
        "  activation_checkpointing: true\n  version: 2\n"
        "  transformer_layer_cls_to_wrap: LlamaDecoderLayer, GPT2Block\n")
    # HYBRID_SHARD: ranks per node from num_processes / num_machines (2 ranks), and without.
    put("fuzz_fsdp", "hybrid-accelerate.yaml",
        acc.replace("fsdp_sharding_strategy: FULL_SHARD", "fsdp_sharding_strategy: HYBRID_SHARD")
           .replace("num_machines: 1", "num_machines: 2"))
    put("fuzz_fsdp", "hybrid-trainer.json", compact({**trainer, "fsdp_sharding_strategy": "HYBRID_SHARD"}))
    put("fuzz_fsdp", "reshard-strategy-name.json",
        compact({"reshard_after_forward": "_HYBRID_SHARD_ZERO2", "sharding_strategy": "5",
                 "mixed_precision": "float16"}))
    # YAML anchors and aliases, flow style, tags, a document marker, comments.
    put("fuzz_fsdp", "alias.yaml",
        "# anchors\n---\ndistributed_type: FSDP\nmixed_precision: &p bf16\nfsdp_config: &c\n"
        "  fsdp_sharding_strategy: &s SHARD_GRAD_OP\n  fsdp_mixed_precision: *p\n"
        "  fsdp_transformer_layer_cls_to_wrap: [LlamaDecoderLayer, *s]\n"
        "  fsdp_offload_params: !!bool yes\n  fsdp_min_num_params: 1e8\n")
    put("fuzz_fsdp", "alias-doubling.yaml",
        "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: &d [*c, *c]\nfsdp_ignored_modules: [*d, *d]\n")
    put("fuzz_fsdp", "flow.yaml", "{distributed_type: FSDP, fsdp_config: {sharding_strategy: NO_SHARD, "
                                  "offload_params: off}, num_processes: 2, num_machines: ~}\n")
    # Slightly broken: refusals by key, malformed text.
    put("fuzz_fsdp", "bad-distributed-type.yaml", acc.replace("distributed_type: FSDP", "distributed_type: DEEPSPEED"))
    put("fuzz_fsdp", "bad-unknown-key.json", compact({**trainer, "fsdp_turbo": True}))
    put("fuzz_fsdp", "bad-both-spellings.json", compact({"fsdp_sharding_strategy": "FULL_SHARD",
                                                        "sharding_strategy": "NO_SHARD"}))
    put("fuzz_fsdp", "bad-wrap-class.json", compact({"transformer_layer_cls_to_wrap": ["GPT2Block"]}))
    put("fuzz_fsdp", "bad-fp8.yaml", "distributed_type: FSDP\nmixed_precision: fp8\nfsdp_config: {}\n")
    put("fuzz_fsdp", "bad-yaml.yaml", "fsdp_config:\n  sharding_strategy: [FULL_SHARD\n  offload: *nowhere\n")
    put("fuzz_fsdp", "bad-json.json", b'{"fsdp_sharding_strategy": "FULL_SHARD",}')
    put("fuzz_fsdp", "commented.json", '// the Trainer\'s file\n{"fsdp_offload_params": true /* cpu */}')
    # Found by fuzz_fsdp: bytes that are not UTF-8 in a YAML scalar (yaml-cpp passes them,
    # a JSON message quoting them could not be written: an abort), and a long string
    # repeated through aliases (under the node budget, 320 MB of text).
    put("fuzz_fsdp", "regress-not-utf8.yaml", b"fsdp_offload_params: \xff\n")
    put("fuzz_fsdp", "regress-not-utf8-list.yaml",
        b"fsdp_config:\n  fsdp_transformer_layer_cls_to_wrap: [LlamaDecoderLayer, \xc3\x28]\n")
    bomb = '&a "' + "x" * 4000 + '"'
    for outer, inner, n in (("b", "a", 9), ("c", "b", 9), ("d", "c", 9), ("e", "d", 9)):
        bomb = "&%s [%s, %s]" % (outer, bomb, ", ".join(["*" + inner] * n))
    put("fuzz_fsdp", "regress-alias-bytes.yaml", "fsdp_offload_params: &f [%s, %s]\n" % (bomb, ", ".join(["*e"] * 7)))


# --- nesting past the bound (base/nesting_limit.h: 512 JSON levels, 64 YAML) --------------
# Every reader refuses these naming the file and line before any parser or walker recurses;
# the "edge" seeds sit at the bound and are read (and dumped into messages) whole. One seed
# per target deep enough to have overflowed the stack before the bound (50,000 levels).

JSON_LIMIT, YAML_LIMIT = 512, 64


def nest(n, value="1"):
    return "[" * n + value + "]" * n


def deep_seeds():
    over, edge = JSON_LIMIT + 1, JSON_LIMIT - 2  # edge: two levels for the keys around it
    put("fuzz_config", "deep-section.json", '{"model": ' + '{"a": ' * over + "1" + "}" * (over + 1))
    put("fuzz_config", "deep-lines.json", '{"train":\n' + "[\n" * over + "]\n" * over + "}")
    put("fuzz_config", "deep-edge.json", '{"train": {"steps": ' + nest(edge) + "}}")
    put("fuzz_config", "deep-50k.json", "[" * 50000)
    put("fuzz_deepspeed", "deep-zero.json", '{"zero_optimization": {"stage": 3, "x": ' + nest(over) + "}}")
    put("fuzz_deepspeed", "deep-edge.json", '{"zero_optimization": {"stage": ' + nest(edge) + "}}")
    m, ranks = checkpoint()
    deep_manifest = '{"format_version": 1, "layout": ' + nest(over) + "}"
    put("fuzz_checkpoint", "deep-manifest",
        parts("step-00000001", deep_manifest, compact(ranks[0][0]), ranks[0][1], compact(ranks[1][0]), ranks[1][1]))
    header = ('{"__metadata__": ' + nest(over) + "}").encode()
    put("fuzz_safetensors", "deep-header", struct.pack("<Q", len(header)) + header)
    put("fuzz_hf_folder", "deep-config", parts('{"architectures": ' + nest(over, '"LlamaForCausalLM"') + "}"))
    put("fuzz_hf_folder", "deep-index",
        parts(compact(gpt2_config()), '{"weight_map": ' + nest(over) + "}", None, None, None))
    put("fuzz_tokens", "deep-meta", b"3" + parts('{"format": "ferry-tokens", "x": ' + nest(over) + "}", b"\0" * 8))
    verse = read("examples/data/verses.jsonl").split(b"\n")[0]
    put("fuzz_jsonl", "deep-record.seed", verse + b"\n" + ('{"text": ' + nest(over, '"x"') + "}").encode() + b"\n")
    put("fuzz_tokenizer", "deep-model.json", '{"model": ' + '{"a": ' * over + "1" + "}" * (over + 1))
    put("fuzz_chat_template", "deep-tokenizer_config.json", '{"chat_template": ' + nest(over, '"x"') + "}")
    # Templates nest at most 256 levels (runtime/text/chat_template_parse.cpp): parentheses,
    # blocks and a left-leaning chain just past it.
    put("fuzz_chat_template", "deep-parens.jinja", "{{ " + "(" * 257 + "1" + ")" * 257 + " }}")
    put("fuzz_chat_template", "deep-blocks.jinja", "{% if true %}" * 257 + "x" + "{% endif %}" * 257)
    put("fuzz_chat_template", "deep-chain.jinja", "{{ 1" + " + 1" * 257 + " }}")
    # Values a render builds nest at most 512 levels (runtime/text/chat_template_ast.h): a list
    # wrapped in loops past the bound, one at it, a namespace holding itself, a chain of them.
    wrap = "{% set ns = namespace(x=[]) %}{% for i in 'x' * N %}{% set ns.x = [ns.x] %}{% endfor %}"
    put("fuzz_chat_template", "deep-value.jinja", wrap.replace("N", "513") + "{{ ns.x }}{{ ns.x | tojson }}")
    put("fuzz_chat_template", "deep-value-at-bound.jinja",
        wrap.replace("N", "511") + "{{ ns.x | tojson | length }}{{ ns.x == ns.x[:] }}{{ [ns.x] }}")
    put("fuzz_chat_template", "deep-namespaces.jinja",
        "{% set ns = namespace(x=1) %}{% set ns.x = [ns, {'a': ns}] %}{{ ns }}{% set h = namespace(n=none) %}"
        "{% for i in 'x' * 600 %}{% set h.n = namespace(n=[h.n]) %}{% endfor %}{{ h.n.n[0].n[0].n is defined }}{{ h }}")
    y_over = YAML_LIMIT + 1
    put("fuzz_fsdp", "deep-flow.yaml", "fsdp_config: " + nest(y_over, "a") + "\n")
    put("fuzz_fsdp", "deep-block.yaml", "".join("  " * i + "k%d:\n" % i for i in range(y_over)) + "  " * y_over + "x\n")
    put("fuzz_fsdp", "deep-seq.yaml", "fsdp_config:\n" + "- " * y_over + "x\n")
    put("fuzz_fsdp", "deep-edge.yaml", "fsdp_config:\n  fsdp_offload_params: " + nest(YAML_LIMIT - 2, "a") + "\n")
    put("fuzz_fsdp", "deep-json.json", '{"fsdp_config": ' + nest(over) + "}")
    put("fuzz_fsdp", "deep-50k.yaml", "[" * 50000)


if __name__ == "__main__":
    config_seeds()
    deepspeed_seeds()
    checkpoint_seeds()
    safetensors_seeds()
    hf_seeds()
    tokens_seeds()
    jsonl_seeds()
    tokenizer_seeds()
    chat_template_seeds()
    fsdp_seeds()
    deep_seeds()
    for t in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, t))
        size = sum(os.path.getsize(os.path.join(OUT, t, f)) for f in files)
        print("%-20s %3d files %7d bytes" % (t, len(files), size))
