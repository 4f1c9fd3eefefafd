#!/usr/bin/python3
"""PyTorch reference for Loom's engine.

Runs engine_torch_ref_dump, builds the same Llama in plain torch (written here:
RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU; no transformers)
from the exported Hugging Face checkpoint, and checks on the same batch:
loss within 1e-5 relative, every parameter gradient within 1e-4 relative in
norm, and the validation loss by the definition in docs/engine.md. The
reference runs in float64, so it is the exact answer Loom's fp32 approximates.
Exits 77 (skipped) when torch is not importable.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable by", sys.executable)
    sys.exit(77)

DTYPE = torch.float64


def read_safetensors(path):
    """Our own safetensors parser: 8-byte LE header length, JSON header, data."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    tensors = {}
    for name, e in header.items():
        assert e["dtype"] == "F32", (path, name, e["dtype"])
        begin, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        tensors[name] = t.reshape(e["shape"]) if e["shape"] else t.reshape(())
    return tensors, meta


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, theta):
    # x: [B, S, heads, hd]; Hugging Face Llama's rotate-half convention.
    seq, hd = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=DTYPE) / hd))
    freqs = torch.arange(seq, dtype=DTYPE)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    return x * cos + rotate_half(x) * sin


def forward_loss(p, cfg, inputs, targets):
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, theta = h // nh, cfg["rms_norm_eps"], cfg["rope_theta"]
    b, s = inputs.shape
    x = p["model.embed_tokens.weight"][inputs]
    mask = torch.full((s, s), float("-inf"), dtype=DTYPE).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        pre = "model.layers.%d." % i
        a = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = (a @ p[pre + "self_attn.q_proj.weight"].T).view(b, s, nh, hd)
        k = (a @ p[pre + "self_attn.k_proj.weight"].T).view(b, s, nkv, hd)
        v = (a @ p[pre + "self_attn.v_proj.weight"].T).view(b, s, nkv, hd)
        q, k = rope(q, theta), rope(k, theta)
        # Query head j reads kv head j // (nh / nkv), as HF's repeat_kv.
        k = k.repeat_interleave(nh // nkv, dim=2)
        v = v.repeat_interleave(nh // nkv, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, heads, S, hd]
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + o @ p[pre + "self_attn.o_proj.weight"].T
        m = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(m @ p[pre + "mlp.gate_proj.weight"].T)
        up = m @ p[pre + "mlp.up_proj.weight"].T
        x = x + (gate * up) @ p[pre + "mlp.down_proj.weight"].T
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    logits = x @ head.T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))


def check(tool, work, tied):
    out = os.path.join(work, "tied" if tied else "untied")
    cmd = [tool, out] + (["--tied"] if tied else [])
    subprocess.run(cmd, check=True)
    with open(os.path.join(out, "hf", "config.json")) as f:
        cfg = json.load(f)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["hidden_act"] == "silu"
    assert cfg["tie_word_embeddings"] == tied
    weights, _ = read_safetensors(os.path.join(out, "hf", "model.safetensors"))
    assert ("lm_head.weight" in weights) == (not tied), sorted(weights)
    dump, meta = read_safetensors(os.path.join(out, "dump.safetensors"))
    params = {n: t.to(DTYPE).requires_grad_(True) for n, t in weights.items()}
    inputs = dump["inputs"].long()
    targets = dump["targets"].long()

    loss = forward_loss(params, cfg, inputs, targets)
    loss.backward()
    failures = []
    loom_loss = float(meta["loss"])
    rel = abs(loom_loss - loss.item()) / abs(loss.item())
    print("%s: loss loom %.9g torch %.9g rel %.2e" % (out, loom_loss, loss.item(), rel))
    if rel > 1e-5:
        failures.append("loss differs by %.2e relative" % rel)
    grad_names = [n[len("grad/"):] for n in dump if n.startswith("grad/")]
    if sorted(grad_names) != sorted(params):
        failures.append("gradient names %s != parameters %s" % (sorted(grad_names), sorted(params)))
    worst = 0.0
    for name in grad_names:
        want = params[name].grad
        got = dump["grad/" + name].to(DTYPE)
        if got.shape != want.shape:
            failures.append("%s: shape %s != %s" % (name, tuple(got.shape), tuple(want.shape)))
            continue
        r = ((got - want).norm() / want.norm()).item()
        worst = max(worst, r)
        if not r <= 1e-4:
            failures.append("%s: gradient differs by %.2e relative in norm" % (name, r))
    print("%s: %d gradients, worst relative error %.2e" % (out, len(grad_names), worst))

    # Validation loss by the documented definition: window i is tokens
    # [i*S, i*S + S] of the validation file, for i < eval_windows.
    seq, windows = int(meta["seq_len"]), int(meta["eval_windows"])
    with open(os.path.join(out, "val.txt"), "rb") as f:
        val = torch.tensor(list(f.read()), dtype=torch.long)
    xs = torch.stack([val[i * seq:i * seq + seq] for i in range(windows)])
    ys = torch.stack([val[i * seq + 1:i * seq + seq + 1] for i in range(windows)])
    with torch.no_grad():
        plain = {n: t.detach() for n, t in params.items()}
        val_loss = forward_loss(plain, cfg, xs, ys).item()
    loom_val = float(meta["val_loss"])
    vrel = abs(loom_val - val_loss) / val_loss
    print("%s: val_loss loom %.9g torch %.9g rel %.2e" % (out, loom_val, val_loss, vrel))
    if vrel > 1e-5:
        failures.append("validation loss differs by %.2e relative" % vrel)
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    failures = []
    for tied in (False, True):
        failures += check(args.tool, args.work, tied)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
