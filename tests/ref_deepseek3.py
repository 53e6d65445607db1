#!/usr/bin/python3
"""An independent evaluation of a meshrun checkpoint, for check_deepseek3.

usage: tests/ref_deepseek3.py CHECKPOINT_DIR TEXT_FILE [--pairing half]

Reads CHECKPOINT_DIR/model.safetensors (Hugging Face names, float32) and
the model's keys (config.json; what it does not hold yet is taken from
meshrun.yml and translated to Hugging Face's meaning), computes the mean
cross-entropy of TEXT_FILE cut into windows of max_target_length + 1
bytes (meshrun eval's windows), and prints

    ref_eval_loss: <loss> windows: <n> max_abs_bias: <b>

Written from Hugging Face's published deepseek_v3 / llama definitions,
in float64 numpy, and computed a second way where meshrun computes one:

* multi-head latent attention in its ABSORBED form: kv_b_proj's key rows
  folded into the query (scores against the normed latent itself) and
  its value rows applied after the attention (the attention sums
  latents), never forming per-head keys or values;
* the rotary embedding as Hugging Face writes it for rope_interleave: the
  rope dims de-interleaved, then rotate_half with cat(freqs, freqs);
  --pairing half uses Llama's pairing instead (a wrong model, so the
  caller can check that the comparison notices);
* the router as a loop over tokens: sigmoid (or softmax) scores, the
  selection bias, group-limited selection (a group's score is the sum
  of its two best biased scores), top-k by repeated arg-max (ties to the
  lower index), the chosen experts' unbiased scores normalised and
  scaled.
"""
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw[base + b:base + e], dtype="<f4").astype(np.float64)
        elif t["dtype"] == "BF16":
            # bfloat16 is the top half of a float32
            h = np.frombuffer(raw[base + b:base + e], dtype="<u2").astype(np.uint32) << 16
            a = h.view(np.float32).astype(np.float64)
        else:
            raise SystemExit(f"ref: tensor {name} has dtype {t['dtype']}, only F32 and BF16 are read")
        out[name] = a.reshape(t["shape"])
    return out


def read_meshrun_yml(path):
    """The flat `key: value` lines cfg_write_yaml writes."""
    kv = {}
    with open(path) as f:
        for line in f:
            if ": " not in line:
                continue
            k, v = line.rstrip("\n").split(": ", 1)
            if v.startswith('"'):
                v = json.loads(v)
            kv[k] = v
    return kv


def model_config(ckpt):
    """Hugging Face's keys; the ones config.json lacks from meshrun.yml."""
    with open(f"{ckpt}/config.json") as f:
        c = json.load(f)
    if not os.path.exists(f"{ckpt}/meshrun.yml"):
        # a Hugging Face directory: config.json is the whole truth
        c["_window"] = int(c["max_position_embeddings"])
        c["_mla"] = c.get("model_type") == "deepseek_v3"
        if c["_mla"] and c.get("q_lora_rank") is None:
            c["q_lora_rank"] = None
        c.setdefault("n_group", 1)
        c.setdefault("topk_group", c["n_group"])
        return c
    y = read_meshrun_yml(f"{ckpt}/meshrun.yml")
    num = lambda k: float(y[k])
    c.setdefault("max_position_embeddings", int(num("max_target_length")))
    c["_window"] = int(num("max_target_length"))
    c["_mla"] = y.get("attention_type", "global") == "mla"
    if c["_mla"]:
        c.setdefault("q_lora_rank", int(num("q_lora_rank")) or None)
        for k in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            c.setdefault(k, int(num(k)))
    if "rope_scaling" not in c and y.get("rope_type") == "yarn":
        c["rope_scaling"] = {
            "type": "yarn", "factor": num("rope_factor"),
            "original_max_position_embeddings": int(num("original_max_position_embeddings")),
            "beta_fast": num("beta_fast"), "beta_slow": num("beta_slow"),
            "mscale": num("mscale"), "mscale_all_dim": num("mscale_all_dim"),
        }
    groups = int(num("n_routing_groups")) if "n_routing_groups" in y else -1
    c.setdefault("n_group", groups if groups > 0 else 1)
    topk = int(num("topk_routing_group")) if "topk_routing_group" in y else -1
    c.setdefault("topk_group", topk if topk > 0 else c["n_group"])
    return c


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def yarn_mscale(f, m=1.0):
    return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0


def rope_tables(c, dim, T):
    """inv_freq and the factor on cos/sin (Hugging Face's
    _compute_default_rope_parameters / _compute_yarn_parameters)."""
    base = float(c.get("rope_theta", 10000.0))
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    rs = c.get("rope_scaling")
    if not rs or rs.get("type", rs.get("rope_type")) != "yarn":
        return np.outer(np.arange(T), 1.0 / pos), 1.0
    f = rs["factor"]
    orig = rs.get("original_max_position_embeddings") or c["max_position_embeddings"]
    bf, bs = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
    ms, msa = rs.get("mscale"), rs.get("mscale_all_dim")
    factor = yarn_mscale(f, ms) / yarn_mscale(f, msa) if ms and msa else yarn_mscale(f)
    cdim = lambda r: dim * math.log(orig / (r * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(cdim(bf)), 0), min(math.ceil(cdim(bs)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    inv = (1.0 / (f * pos)) * (1 - extra) + (1.0 / pos) * extra
    return np.outer(np.arange(T), inv), factor


def rotate(x, ang, factor, interleave):
    """x (..., T, D) by angles ang (T, D/2): Hugging Face's
    apply_rotary_pos_emb(_interleave)."""
    D = x.shape[-1]
    if interleave:
        x = x.reshape(*x.shape[:-1], D // 2, 2).swapaxes(-1, -2).reshape(x.shape)
    emb = np.concatenate([ang, ang], -1)
    cos, sin = np.cos(emb) * factor, np.sin(emb) * factor
    half = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    return x * cos + half * sin


def causal_softmax(s):
    T = s.shape[-1]
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(-1, keepdims=True)


def mla_absorbed(c, W, pre, x, ang, factor, interleave):
    """DeepseekV3Attention with kv_b_proj absorbed; x (B, T, C)."""
    H, Dn, Dr, Dv = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                     c["v_head_dim"])
    R = c["kv_lora_rank"]
    B, T, _ = x.shape
    if c.get("q_lora_rank"):
        qa = rmsnorm(x @ W[pre + "q_a_proj.weight"].T, W[pre + "q_a_layernorm.weight"], 1e-6)
        q = qa @ W[pre + "q_b_proj.weight"].T
    else:
        q = x @ W[pre + "q_proj.weight"].T
    q = q.reshape(B, T, H, Dn + Dr).transpose(0, 2, 1, 3)          # B H T Dk
    q_nope, q_rope = q[..., :Dn], q[..., Dn:]
    kva = x @ W[pre + "kv_a_proj_with_mqa.weight"].T
    lat = rmsnorm(kva[..., :R], W[pre + "kv_a_layernorm.weight"], 1e-6)  # B T R
    k_rope = kva[..., R:][:, None]                                  # B 1 T Dr
    q_rope = rotate(q_rope, ang, factor, interleave)
    k_rope = rotate(k_rope, ang, factor, interleave)
    wkv = W[pre + "kv_b_proj.weight"].reshape(H, Dn + Dv, R)
    w_uk, w_uv = wkv[:, :Dn], wkv[:, Dn:]                          # H Dn R, H Dv R
    q_abs = np.einsum("bhtd,hdr->bhtr", q_nope, w_uk)              # the query in latent space
    scale = (Dn + Dr) ** -0.5
    rs = c.get("rope_scaling")
    if rs and rs.get("mscale_all_dim"):
        scale *= yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    s = (np.einsum("bhtr,bsr->bhts", q_abs, lat) +
         np.einsum("bhtd,bxsd->bhts", q_rope, k_rope)) * scale
    p = causal_softmax(s)
    o_lat = np.einsum("bhts,bsr->bhtr", p, lat)                    # latents summed
    o = np.einsum("bhtr,hvr->bthv", o_lat, w_uv).reshape(B, T, H * Dv)
    return o @ W[pre + "o_proj.weight"].T


def gqa(c, W, pre, x, ang, factor):
    """LlamaAttention (rotate_half pairing, scale 1/sqrt(head_dim))."""
    H, Hk = c["num_attention_heads"], c["num_key_value_heads"]
    B, T, _ = x.shape
    D = c.get("head_dim") or c["hidden_size"] // H
    q = (x @ W[pre + "q_proj.weight"].T).reshape(B, T, H, D).transpose(0, 2, 1, 3)
    k = (x @ W[pre + "k_proj.weight"].T).reshape(B, T, Hk, D).transpose(0, 2, 1, 3)
    v = (x @ W[pre + "v_proj.weight"].T).reshape(B, T, Hk, D).transpose(0, 2, 1, 3)
    q, k = rotate(q, ang, factor, False), rotate(k, ang, factor, False)
    k, v = np.repeat(k, H // Hk, 1), np.repeat(v, H // Hk, 1)
    p = causal_softmax(np.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(D))
    o = np.einsum("bhts,bhsd->bthd", p, v).reshape(B, T, H * D)
    return o @ W[pre + "o_proj.weight"].T


def mlp(W, pre, x):
    return (silu(x @ W[pre + "gate_proj.weight"].T) * (x @ W[pre + "up_proj.weight"].T)) @ \
        W[pre + "down_proj.weight"].T


# tokens routed, and those whose experts the group limit changed
ROUTING = {"tokens": 0, "rerouted": 0}


def route(c, logits, bias):
    """One token: (experts, gate weights), by a loop."""
    E, k = len(logits), c["num_experts_per_tok"]
    if c.get("scoring_func", "sigmoid") == "sigmoid":
        scores = [1.0 / (1.0 + math.exp(-v)) for v in logits]
    else:
        m = max(logits)
        e = [math.exp(v - m) for v in logits]
        scores = [v / sum(e) for v in e]
    biased = [scores[e] + (bias[e] if bias is not None else 0.0) for e in range(E)]
    G, tg = c["n_group"], c["topk_group"]
    allowed = set(range(E))
    if G > 1:
        per = E // G
        gscore = []
        for g in range(G):
            best = sorted(biased[g * per:(g + 1) * per], reverse=True)
            gscore.append(best[0] + best[1])
        chosen = []
        for _ in range(tg):
            g = max((gg for gg in range(G) if gg not in chosen), key=lambda gg: (gscore[gg], -gg))
            chosen.append(g)
        allowed = {e for e in range(E) if e // per in chosen}
    # Only the chosen groups' experts compete (DeepSeek's own inference
    # code; Hugging Face's masked_fill(0.0) differs only when fewer than k
    # allowed experts have a positive biased score: docs/training-step.md)
    def top(cands):
        picked = []
        for _ in range(k):
            e = max((ee for ee in cands if ee not in picked), key=lambda ee: (biased[ee], -ee))
            picked.append(e)
        return picked
    picked = top(allowed)
    if G > 1 and sorted(picked) != sorted(top(range(E))):
        ROUTING["rerouted"] += 1
    ROUTING["tokens"] += 1
    w = [scores[e] for e in picked]
    if c.get("norm_topk_prob", True):
        s = sum(w) + 1e-20
        w = [v / s for v in w]
    return picked, [v * c.get("routed_scaling_factor", 1.0) for v in w]


def moe(c, W, pre, x):
    B, T, C = x.shape
    xs = x.reshape(-1, C)
    logits = xs @ W[pre + "gate.weight"].T
    bias = W.get(pre + "gate.e_score_correction_bias")
    out = np.zeros_like(xs)
    rows = {}
    for n in range(xs.shape[0]):
        experts, weights = route(c, list(logits[n]), None if bias is None else list(bias))
        for e, w in zip(experts, weights):
            rows.setdefault(e, []).append((n, w))
    for e, lst in rows.items():
        idx = np.array([n for n, _ in lst])
        w = np.array([v for _, v in lst])[:, None]
        out[idx] += w * mlp(W, f"{pre}experts.{e}.", xs[idx])
    if c.get("n_shared_experts", 0):
        out += mlp(W, pre + "shared_experts.", xs)
    return out.reshape(B, T, C)


def forward_loss(c, W, tokens, targets, interleave):
    x = W["model.embed_tokens.weight"][tokens]
    B, T = tokens.shape
    eps = c["rms_norm_eps"]
    if c["_mla"]:
        ang, factor = rope_tables(c, c["qk_rope_head_dim"], T)
    else:
        ang, factor = rope_tables(c, c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], T)
    for l in range(c["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        h = rmsnorm(x, W[pre + "input_layernorm.weight"], eps)
        if c["_mla"]:
            x = x + mla_absorbed(c, W, pre + "self_attn.", h, ang, factor, interleave)
        else:
            x = x + gqa(c, W, pre + "self_attn.", h, ang, factor)
        h = rmsnorm(x, W[pre + "post_attention_layernorm.weight"], eps)
        if c.get("n_routed_experts") and l >= c.get("first_k_dense_replace", 0):
            x = x + moe(c, W, pre + "mlp.", h)
        else:
            x = x + mlp(W, pre + "mlp.", h)
    x = rmsnorm(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = x @ head.T
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return float((lse - picked).sum())


def main():
    args = sys.argv[1:]
    interleave = True
    if "--pairing" in args:
        i = args.index("--pairing")
        interleave = args[i + 1] != "half"
        del args[i:i + 2]
    if len(args) != 2:
        raise SystemExit(__doc__)
    ckpt, text = args
    c = model_config(ckpt)
    W = read_safetensors(f"{ckpt}/model.safetensors")
    data = np.frombuffer(open(text, "rb").read(), dtype=np.uint8).astype(np.int64)
    T = c["_window"]
    n = len(data) // (T + 1)
    if n < 1:
        raise SystemExit(f"ref: '{text}' is shorter than one window of {T + 1} bytes")
    win = data[:n * (T + 1)].reshape(n, T + 1)
    total = 0.0
    for b in range(0, n, 64):
        total += forward_loss(c, W, win[b:b + 64, :T], win[b:b + 64, 1:], interleave)
    bias = max((float(np.abs(v).max()) for k, v in W.items() if k.endswith("e_score_correction_bias")),
               default=0.0)
    print(f"ref_eval_loss: {total / (n * T):.12f} windows: {n} max_abs_bias: {bias:.6g} "
          f"routed_tokens: {ROUTING['tokens']} group_rerouted: {ROUTING['rerouted']}")


if __name__ == "__main__":
    main()
