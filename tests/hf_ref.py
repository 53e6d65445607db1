#!/usr/bin/python3
"""Hugging Face checkpoints for tests/check_hfload.c, and a second,
independent implementation of the models they hold (numpy, float64).

  hf_ref.py make DIR [options]      writes config.json and safetensors shards
  hf_ref.py eval DIR TEXT T         prints the mean next-token loss over TEXT

`make` writes a random model of model_type llama or meshrun_moe (Llama
attention and DeepSeek-V3's router) in BF16, F16 or F32, in --shards files
named as Hugging Face names them, each with its tensors in shuffled order,
plus model.safetensors.index.json; options break it in one way each, for
the loader's refusals. `eval` reads such a directory (or a meshrun
checkpoint directory) with its own safetensors reader and computes the
model from the published definitions: transformers' LlamaForCausalLM
(RMSNorm, rotary embedding pairing dimension i with i + d/2, grouped-query
attention, SwiGLU) and DeepseekV3MoE's routing (sigmoid scores, selection
on score + e_score_correction_bias within the best groups, weights the
unbiased scores normalised and scaled, shared experts), over the windows
`meshrun eval` uses: non-overlapping windows of T+1 bytes.
Written for these tests from those definitions; nothing here is meshrun's
code.
"""
import json
import os
import struct
import sys

import numpy as np


# ---- safetensors, both ways ----

def bf16_bits(x):
    """float32 array -> uint16 bfloat16 bits, rounded to nearest even"""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return r.astype(np.uint16)


def encode(x, dtype):
    if dtype == "BF16":
        return bf16_bits(x).tobytes()
    if dtype == "F16":
        return np.asarray(x, dtype=np.float16).tobytes()
    return np.asarray(x, dtype=np.float32).tobytes()


def stored(x, dtype):
    """the float64 values a reader gets back from encode(x, dtype)"""
    if dtype == "BF16":
        return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "F16":
        return np.asarray(x, dtype=np.float16).astype(np.float64)
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def write_file(path, items, pad=True, header_hook=None, past=0):
    """items: list of (name, dtype, shape, raw bytes); data in list order;
    past: the last tensor's range claims that many bytes beyond the file"""
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name, dtype, shape, raw in items:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    if past:
        header[items[-1][0]]["data_offsets"][1] += past
    text = json.dumps(header)
    if header_hook:
        text = header_hook(text)
    raw = text.encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


def read_file(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base, out = 8 + n, {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        raw = data[base + a:base + b]
        if e["dtype"] == "BF16":
            v = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif e["dtype"] == "F16":
            v = np.frombuffer(raw, np.float16)
        elif e["dtype"] == "F32":
            v = np.frombuffer(raw, np.float32)
        else:
            raise ValueError("dtype " + e["dtype"])
        out[name] = v.astype(np.float64).reshape(e["shape"])
    return out


def read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_file(os.path.join(d, f)))
    return w


# ---- making a checkpoint ----

def opts(argv):
    o = {"type": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "inter": 48,
         "vocab": 256, "dtype": "BF16", "shards": 3, "seed": 1, "tied": 0, "experts": 8, "topk": 2,
         "moe_inter": 16, "shared": 1, "dense": 1, "groups": 4, "topk_groups": 2, "scale": 2.5,
         "mtp": 0, "std": 0.08}
    flags = {}
    i = 0
    while i < len(argv):
        k = argv[i][2:]
        if k in o:
            o[k] = type(o[k])(argv[i + 1]) if not isinstance(o[k], str) else argv[i + 1]
            i += 2
        else:  # a way to break the checkpoint: --drop NAME, --hlen-past, ...
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                flags[k] = argv[i + 1]
                i += 2
            else:
                flags[k] = True
                i += 1
    return o, flags


def tensors(o, rng):
    """name -> (shape, float32 values) of a random model"""
    C, H, Hkv, F, V, L = o["hidden"], o["heads"], o["kv_heads"], o["inter"], o["vocab"], o["layers"]
    D = C // H
    moe = o["type"] == "meshrun_moe"
    t = {}

    # values are made when a tensor is written (seeded by its name), so a
    # checkpoint of many GiB never sits in memory whole
    def mat(name, *shape, std=None):
        seed = o["seed"] * 1000003 + len(t)
        s = np.float32(std or o["std"])
        t[name] = (shape, lambda: np.random.default_rng(seed).standard_normal(shape, np.float32) * s)

    def norm(name, n):
        seed = o["seed"] * 1000003 + len(t)
        t[name] = ((n,), lambda: (1.0 + 0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32))

    mat("model.embed_tokens.weight", V, C)
    norm("model.norm.weight", C)
    if not o["tied"]:
        mat("lm_head.weight", V, C)
    layers = L + o["mtp"]  # a multi-token-prediction layer looks like one more layer
    for l in range(layers):
        p = "model.layers.%d." % l
        norm(p + "input_layernorm.weight", C)
        norm(p + "post_attention_layernorm.weight", C)
        mat(p + "self_attn.q_proj.weight", H * D, C)
        mat(p + "self_attn.k_proj.weight", Hkv * D, C)
        mat(p + "self_attn.v_proj.weight", Hkv * D, C)
        mat(p + "self_attn.o_proj.weight", C, H * D)
        if not moe or l < o["dense"]:
            mat(p + "mlp.gate_proj.weight", F, C)
            mat(p + "mlp.up_proj.weight", F, C)
            mat(p + "mlp.down_proj.weight", C, F)
            continue
        E, Fe = o["experts"], o["moe_inter"]
        # router logits of a few units, so scores spread over (0, 1) and
        # groups change choices; a bias large enough to change some too,
        # kept F32 as DeepSeek does
        mat(p + "mlp.gate.weight", E, C, std=0.5)
        bias = (0.1 * rng.standard_normal(E)).astype(np.float32)
        t[p + "mlp.gate.e_score_correction_bias"] = ((E,), lambda b=bias: b)
        for e in range(E):
            mat(p + "mlp.experts.%d.gate_proj.weight" % e, Fe, C)
            mat(p + "mlp.experts.%d.up_proj.weight" % e, Fe, C)
            mat(p + "mlp.experts.%d.down_proj.weight" % e, C, Fe)
        if o["shared"]:
            SF = o["shared"] * Fe
            mat(p + "mlp.shared_experts.gate_proj.weight", SF, C)
            mat(p + "mlp.shared_experts.up_proj.weight", SF, C)
            mat(p + "mlp.shared_experts.down_proj.weight", C, SF)
    return t


def config(o, flags):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": o["type"],
         "hidden_size": int(flags.get("config-hidden", o["hidden"])), "intermediate_size": o["inter"],
         "num_attention_heads": o["heads"], "num_key_value_heads": o["kv_heads"],
         "num_hidden_layers": o["layers"], "vocab_size": o["vocab"], "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": bool(o["tied"]),
         "hidden_act": "silu", "torch_dtype": "bfloat16"}
    if o["type"] == "meshrun_moe":
        c.update({"architectures": ["MeshrunMoeForCausalLM"], "n_routed_experts": o["experts"],
                  "num_experts_per_tok": o["topk"], "moe_intermediate_size": o["moe_inter"],
                  "n_shared_experts": o["shared"], "first_k_dense_replace": o["dense"],
                  "n_group": o["groups"], "topk_group": o["topk_groups"], "scoring_func": "sigmoid",
                  "topk_method": "noaux_tc", "norm_topk_prob": True,
                  "routed_scaling_factor": o["scale"], "num_nextn_predict_layers": o["mtp"],
                  "meshrun_attention_type": "global"})
    return c


def make(d, argv):
    o, flags = opts(argv)
    rng = np.random.default_rng(o["seed"])
    t = tensors(o, rng)
    os.makedirs(d, exist_ok=True)
    json.dump(config(o, flags), open(os.path.join(d, "config.json"), "w"), indent=1)
    if "drop" in flags:
        del t[flags["drop"]]
    if "bad-shape" in flags:  # one tensor one row longer than the model's
        shape, v = t[flags["bad-shape"]]
        shape = (shape[0] + 1,) + tuple(shape[1:])
        t[flags["bad-shape"]] = (shape, lambda: (rng.standard_normal(shape) * o["std"]).astype(np.float32))
    if "fp8" in flags:  # what an FP8 checkpoint adds next to each weight
        t["model.layers.0.mlp.down_proj.weight_scale_inv"] = ((1, 1), lambda: np.ones((1, 1), np.float32))
    names = list(t)
    rng.shuffle(names)
    n = o["shards"]
    parts = [names[i::n] for i in range(n)]
    fname = ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)]
    wmap = {name: fname[i] for i in range(n) for name in parts[i]}
    if "dup" in flags:  # the same tensor in two shards
        parts[(wmap[flags["dup"]] == fname[0]) + 0].append(flags["dup"])
    total = 0
    for i in range(n):
        items = []
        for name in parts[i]:
            shape, v = t[name]
            dt = "F32" if name.endswith("e_score_correction_bias") else o["dtype"]
            items.append((name, dt, shape, encode(v(), dt)))
            total += len(items[-1][3])
        hook = None
        if i == 0 and "dup-in-file" in flags:  # a name twice in one header
            first = parts[0][0]
            hook = lambda text: text.replace('"%s": ' % first, '"%s": {"dtype": "F32", "shape": [0], '
                                             '"data_offsets": [0, 0]}, "%s": ' % (first, first), 1)
        # offset-past: the last tensor of shard 1 claims bytes past the file
        write_file(os.path.join(d, fname[i]), items, header_hook=hook,
                   past=4096 if i == 0 and "offset-past" in flags else 0)
        if i == 0 and "hlen-past" in flags:  # the header length runs past the file
            p = os.path.join(d, fname[i])
            size = os.path.getsize(p)
            with open(p, "r+b") as f:
                f.write(struct.pack("<Q", size + 100))
    if "index-wrong" in flags:  # the index puts a tensor in another shard
        name = parts[0][0]
        wmap[name] = fname[1]
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(d, "model.safetensors.index.json"), "w"), indent=1)
    print(total)


# ---- the models, in float64 ----

def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def attention(x, w, p, c, T):
    H, Hkv, C = c["num_attention_heads"], c["num_key_value_heads"], c["hidden_size"]
    D = c.get("head_dim") or C // H
    q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, D)
    k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(T, Hkv, D)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
    inv = 1.0 / (c.get("rope_theta", 10000.0) ** (np.arange(0, D, 2) / D))
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=1)[:, None, :]

    def rot(a):  # rotate_half: dimension i pairs with i + D/2
        return np.concatenate([-a[..., D // 2:], a[..., :D // 2]], axis=-1)

    q = q * cos + rot(q) * sin
    k = k * cos + rot(k) * sin
    out = np.zeros((T, H, D))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for h in range(H):
        kv = h // (H // Hkv)
        s = q[:, h, :] @ k[:, kv, :].T / np.sqrt(D) + mask
        s = np.exp(s - s.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        out[:, h, :] = s @ v[:, kv, :]
    return out.reshape(T, H * D) @ w[p + "self_attn.o_proj.weight"].T


def swiglu(x, w, p):
    return (silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


GROUPED = [0, 0]  # tokens routed; tokens whose experts the groups changed


def route(s, bias, c):
    """DeepSeek-V3's choice for one token, by plain loops: the groups with
    the best sums of their two best keys, then the best keys inside them"""
    E, G, TG, K = len(s), c["n_group"], c["topk_group"], c["num_experts_per_tok"]
    key = [s[e] + bias[e] for e in range(E)]
    per = E // G
    gscore = []
    for g in range(G):
        ks = sorted(key[g * per:(g + 1) * per], reverse=True)
        gscore.append(ks[0] + ks[1])
    groups = sorted(range(G), key=lambda g: (-gscore[g], g))[:TG]
    allowed = [e for e in range(E) if e // per in groups]
    chosen = sorted(allowed, key=lambda e: (-key[e], e))[:K]
    plain = sorted(range(E), key=lambda e: (-key[e], e))[:K]
    GROUPED[0] += 1
    GROUPED[1] += set(chosen) != set(plain)
    tot = sum(s[e] for e in chosen)
    scale = c["routed_scaling_factor"]
    return [(e, s[e] / (tot + 1e-20) * scale if c["norm_topk_prob"] else s[e] * scale) for e in chosen]


def moe(x, w, p, c):
    s = 1.0 / (1.0 + np.exp(-(x @ w[p + "mlp.gate.weight"].T)))
    bias = w[p + "mlp.gate.e_score_correction_bias"]
    y = np.zeros_like(x)
    for n in range(x.shape[0]):
        for e, wt in route(s[n], bias, c):
            y[n] += wt * swiglu(x[n:n + 1], w, p + "mlp.experts.%d." % e)[0]
    if c.get("n_shared_experts"):
        y += swiglu(x, w, p + "mlp.shared_experts.")
    return y


def forward_loss(w, c, tokens, targets):
    T, eps = len(tokens), c.get("rms_norm_eps", 1e-6)
    h = w["model.embed_tokens.weight"][tokens]
    moe_from = c["first_k_dense_replace"] if c["model_type"] == "meshrun_moe" else c["num_hidden_layers"]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = h + attention(rmsnorm(h, w[p + "input_layernorm.weight"], eps), w, p, c, T)
        x = rmsnorm(h, w[p + "post_attention_layernorm.weight"], eps)
        h = h + (moe(x, w, p, c) if l >= moe_from else swiglu(x, w, p + "mlp."))
    x = rmsnorm(h, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    logits = x @ head.T
    m = logits.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
    return float(np.sum(lse - logits[np.arange(T), targets]))


def evaluate(d, text, T):
    c = json.load(open(os.path.join(d, "config.json")))
    w = read_dir(d)
    data = np.frombuffer(open(text, "rb").read(), np.uint8).astype(np.int64)
    n = len(data) // (T + 1)
    total = 0.0
    for i in range(n):
        win = data[i * (T + 1):(i + 1) * (T + 1)]
        total += forward_loss(w, c, win[:T], win[1:])
    print("%.17g" % (total / (n * T)))
    if GROUPED[0]:  # how much the test exercised group-limited routing
        sys.stderr.write("routed %d tokens, groups changed the experts of %d\n" % tuple(GROUPED))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2].startswith("-"):
        sys.exit("usage: hf_ref.py make DIR [options] | eval DIR TEXT T (see the top of this file)")
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:])
    elif sys.argv[1] == "eval":
        evaluate(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit("usage: hf_ref.py make DIR [options] | eval DIR TEXT T")
