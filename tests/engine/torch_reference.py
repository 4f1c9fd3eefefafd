#!/usr/bin/python3
"""PyTorch reference for Loom's engine.

Runs engine_torch_ref_dump, builds the same Llama in plain torch (written here:
RMSNorm, rotate-half RoPE, grouped-query attention, SwiGLU; no transformers)
from the exported Hugging Face checkpoint, and checks on the same batch:
(and the same for two mixture-of-experts models, check_moe, with the router,
aux loss, tokens per expert, bias update and the Mixtral / Qwen2-MoE export)
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


def forward_loss(p, cfg, inputs, targets, moe=None, biases=None, extra=None):
    """Mean cross-entropy; with `moe` (model.moe as in metadata.json) the MoE
    layers' aux losses, tokens per expert and drops are appended to `extra`."""
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
        if moe is not None and i >= moe["first_dense_layers"]:
            bias = biases.get(pre + "mlp.gate.e_score_correction_bias", 0.0)
            y, aux, dropped = moe_ffn(p, pre, m, moe, bias, extra["loads"])
            extra["aux"].append(aux)
            extra["dropped"] += dropped
            x = x + y
            continue
        gate = torch.nn.functional.silu(m @ p[pre + "mlp.gate_proj.weight"].T)
        up = m @ p[pre + "mlp.up_proj.weight"].T
        x = x + (gate * up) @ p[pre + "mlp.down_proj.weight"].T
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    logits = x @ head.T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))


def swiglu(x, gate, up, down):
    return (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T


def moe_ffn(p, pre, m, moe, bias, loads):
    """Loom's MoE FFN (docs/moe.md) from its definition: scores, top-k by
    score + bias (bias for selection only, ties to the lower expert), weights
    renormalized, capacity drops in assignment order, experts, shared experts,
    and the aux loss coef * E * sum f_e P_e (f: routed share, P: mean prob)."""
    b, s, h = m.shape
    x = m.reshape(-1, h)
    t, e_count, k = x.shape[0], moe["num_experts"], moe["top_k"]
    logits = x @ p[pre + "mlp.gate.weight"].T
    if moe["router_score"] == "softmax":
        scores = torch.softmax(logits, dim=-1)
        probs = scores
    else:
        scores = torch.sigmoid(logits)
        probs = scores / scores.sum(-1, keepdim=True)
    select = scores.detach() + bias
    idx = torch.sort(select, dim=-1, descending=True, stable=True).indices[:, :k]
    chosen = scores.gather(1, idx)
    weights = chosen / chosen.sum(-1, keepdim=True)
    flat = idx.reshape(-1).tolist()
    routed = torch.bincount(idx.reshape(-1), minlength=e_count)
    loads.append(routed)
    factor = moe.get("capacity_factor")
    cap = max(1, math.ceil(factor * t * k / e_count)) if factor else 0
    counts, keep = [0] * e_count, []
    for e in flat:
        keep.append(cap == 0 or counts[e] < cap)
        counts[e] += 1 if keep[-1] else 0
    out = torch.zeros_like(x)
    for e in range(e_count):
        rows = [a for a in range(t * k) if flat[a] == e and keep[a]]
        if not rows:
            continue
        rows = torch.tensor(rows)
        tok, j = rows // k, rows % k
        pe = pre + "mlp.experts.%d." % e
        y = swiglu(x[tok], p[pe + "gate_proj.weight"], p[pe + "up_proj.weight"],
                   p[pe + "down_proj.weight"])
        out = out.index_add(0, tok, weights[tok, j][:, None] * y)
    if moe["num_shared_experts"] > 0:
        ps = pre + "mlp.shared_experts."
        out = out + swiglu(x, p[ps + "gate_proj.weight"], p[ps + "up_proj.weight"],
                           p[ps + "down_proj.weight"])
    f = routed.to(DTYPE) / (t * k)
    aux = moe["aux_loss_coef"] * e_count * (f * probs.mean(0)).sum()
    return out.view(b, s, h), aux, sum(1 for x in keep if not x)


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


def hf_moe_to_loom(weights, cfg, moe):
    """The exported Mixtral / Qwen2-MoE tensors, by their HF names, as the
    Loom parameters they must compute: Mixtral's w1/w3/w2 are gate/up/down;
    Qwen2-MoE's shared expert is scaled by sigmoid(shared_expert_gate . x),
    its attention has q/k/v biases, both zero in an export, so the scale is 1/2."""
    mixtral = cfg["model_type"] == "mixtral"
    assert cfg["architectures"] == (["MixtralForCausalLM"] if mixtral else ["Qwen2MoeForCausalLM"])
    assert cfg["num_experts_per_tok"] == moe["top_k"]
    p = {}
    for name, t in weights.items():
        t = t.to(DTYPE)
        if name.endswith("_proj.bias") or name.endswith("shared_expert_gate.weight"):
            assert not t.any(), name + " must be zeros"
            continue
        if mixtral and ".block_sparse_moe." in name:
            name = name.replace(".block_sparse_moe.", ".mlp.")
            for hf, loom in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
                name = name.replace(".%s.weight" % hf, ".%s.weight" % loom)
        if ".mlp.shared_expert." in name:
            if moe["num_shared_experts"] == 0:
                assert not t.any(), name + " must be zeros without shared experts"
                continue
            name = name.replace(".mlp.shared_expert.", ".mlp.shared_experts.")
            if name.endswith("down_proj.weight"):
                t = t * torch.sigmoid(torch.zeros((), dtype=DTYPE))
        p[name] = t
    return p


def check_moe(tool, work, score):
    """[moe] An MoE model (docs/moe.md): the loss, aux loss, every gradient
    (router included), tokens per expert, the bias update, the validation
    loss, and (softmax) the Hugging Face export, loaded by HF names."""
    out = os.path.join(work, "moe_" + score)
    subprocess.run([tool, out, "--moe=" + score], check=True)
    step_dir = sorted(os.listdir(os.path.join(out, "ckpt")))[-1]
    with open(os.path.join(out, "ckpt", step_dir, "metadata.json")) as f:
        model = json.load(f)["model"]
    moe = model["moe"]
    cfg = {"hidden_size": model["hidden_size"], "num_attention_heads": model["num_heads"],
           "num_key_value_heads": model["num_kv_heads"], "rms_norm_eps": model["norm_eps"],
           "rope_theta": model["rope_theta"], "num_hidden_layers": model["num_layers"],
           "tie_word_embeddings": model["tie_embeddings"]}
    dump, meta = read_safetensors(os.path.join(out, "dump.safetensors"))
    params = {n[len("param/"):]: t.to(DTYPE).requires_grad_(True)
              for n, t in dump.items() if n.startswith("param/")}
    biases = {n[len("bias/"):]: t.to(DTYPE) for n, t in dump.items() if n.startswith("bias/")}
    inputs, targets = dump["inputs"].long(), dump["targets"].long()
    extra = {"loads": [], "aux": [], "dropped": 0}
    ce = forward_loss(params, cfg, inputs, targets, moe, biases, extra)
    aux = sum(extra["aux"])
    (ce + aux).backward()
    failures = []
    for what, loom, ref in (("loss", float(meta["loss"]), ce.item()),
                            ("aux loss", float(meta["aux_loss"]), aux.item())):
        rel = abs(loom - ref) / abs(ref)
        print("%s: %s loom %.9g torch %.9g rel %.2e" % (out, what, loom, ref, rel))
        if rel > 1e-5:
            failures.append("%s %s differs by %.2e relative" % (out, what, rel))
    grad_names = [n[len("grad/"):] for n in dump if n.startswith("grad/")]
    if sorted(grad_names) != sorted(params):
        failures.append("gradient names %s != parameters %s" % (sorted(grad_names), sorted(params)))
    worst = 0.0
    for name in grad_names:
        want, got = params[name].grad, dump["grad/" + name].to(DTYPE)
        if want is None or not want.norm() > 0:  # an expert no token was routed to
            if got.any():
                failures.append("%s: gradient where the reference has none" % name)
            continue
        r = ((got - want).norm() / want.norm()).item()
        worst = max(worst, r)
        if not r <= 1e-4:
            failures.append("%s: gradient differs by %.2e relative in norm" % (name, r))
    print("%s: %d gradients (routers included), worst relative error %.2e, %d rows dropped"
          % (out, len(grad_names), worst, extra["dropped"]))
    # Tokens per expert of each MoE layer, and the bias update they drive.
    for layer, routed in enumerate(extra["loads"]):
        got = dump["load/%d" % layer].to(torch.long)
        if not torch.equal(got, routed):
            failures.append("layer slot %d: tokens per expert %s != %s" % (layer, got.tolist(), routed.tolist()))
    rate = moe["bias_update_rate"]
    moe_layers = [i for i in range(model["num_layers"]) if i >= moe["first_dense_layers"]]
    for slot, i in enumerate(moe_layers):
        name = "model.layers.%d.mlp.gate.e_score_correction_bias" % i
        load = extra["loads"][slot].to(DTYPE)
        want = biases[name] + rate * torch.sign(load.mean() - load)
        got = dump["bias_after/" + name].to(DTYPE)
        if not (got - want).abs().max().item() <= 1e-6:
            failures.append("%s: bias after the update %s != %s" % (name, got.tolist(), want.tolist()))
    if rate > 0:
        if not any(b.abs().max().item() > 0 for b in biases.values()):
            failures.append("%s: the biases are still zero after training with a rate" % out)
        if extra["dropped"] == 0:
            failures.append("%s: the capacity dropped nothing: the check does not exercise it" % out)
    print("%s: tokens per expert %s, bias rate %g" % (out, [l.tolist() for l in extra["loads"]], rate))

    seq, windows = int(meta["seq_len"]), int(meta["eval_windows"])
    with open(os.path.join(out, "val.txt"), "rb") as f:
        val = torch.tensor(list(f.read()), dtype=torch.long)
    xs = torch.stack([val[i * seq:i * seq + seq] for i in range(windows)])
    ys = torch.stack([val[i * seq + 1:i * seq + seq + 1] for i in range(windows)])
    plain = {n: t.detach() for n, t in params.items()}
    with torch.no_grad():
        # Each micro-batch of windows is routed on its own (capacity counts per micro-batch).
        mb = 4
        total = 0.0
        for first in range(0, windows, mb):
            ex = {"loads": [], "aux": [], "dropped": 0}
            n = min(mb, windows - first)
            total += forward_loss(plain, cfg, xs[first:first + n], ys[first:first + n], moe,
                                  biases, ex).item() * n
        val_loss = total / windows
    vrel = abs(float(meta["val_loss"]) - val_loss) / val_loss
    print("%s: val_loss loom %.9g torch %.9g rel %.2e" % (out, float(meta["val_loss"]), val_loss, vrel))
    if vrel > 1e-5:
        failures.append("%s: validation loss differs by %.2e relative" % (out, vrel))

    hf_dir = os.path.join(out, "hf")
    if score == "sigmoid":  # no HF layout: refused
        if os.path.exists(hf_dir):
            failures.append("%s: a sigmoid router was exported" % out)
        return failures
    with open(os.path.join(hf_dir, "config.json")) as f:
        hf_cfg = json.load(f)
    weights, _ = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    hf_params = hf_moe_to_loom(weights, hf_cfg, moe)
    if sorted(hf_params) != sorted(params):
        failures.append("HF export names map to %s, not %s" % (sorted(hf_params), sorted(params)))
        return failures
    # The export is of the checkpoint (step 3), the dumped pass of the same weights.
    with torch.no_grad():
        hf_loss = forward_loss(hf_params, cfg, inputs, targets, moe, {},
                               {"loads": [], "aux": [], "dropped": 0}).item()
    hrel = abs(float(meta["loss"]) - hf_loss) / hf_loss
    print("%s: HF export (%s) loss %.9g rel %.2e" % (out, hf_cfg["architectures"][0], hf_loss, hrel))
    if hrel > 1e-5:
        failures.append("%s: the HF export's loss differs by %.2e relative" % (out, hrel))
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
    for score in ("softmax", "sigmoid", "mixtral"):
        failures += check_moe(args.tool, args.work, score)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
