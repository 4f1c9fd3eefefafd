#!/usr/bin/env python3
"""PyTorch's own training step for the Llama that loom-trainer trains in
scripts/device/gpu_train_check.sh (check c): the baseline our tokens/s and
MFU stand beside, measured on the same GPU in the same run.

A plain PyTorch Llama: token embedding, per layer RMSNorm -> attention (q, k,
v projections, RoPE, grouped-query heads, causal SDPA) -> residual, RMSNorm
-> SwiGLU MLP -> residual; final RMSNorm, untied LM head, cross-entropy.
bf16 autocast over fp32 weights, fused AdamW (lr 3e-4, betas 0.9/0.95, wd
0.1), gradient clipping at 1.0, gradient accumulation over micro-batches:
the recipe and batch of scripts/device/jobs/llama1b_gpu_bf16.yaml. The
tokens are random (the data does not change the step's cost).

FLOPs per token use the trainer's formula (ModelFlopsPerToken in
worker/engine/training_loop.cc): 6 * (parameters - input embedding when
untied) + 12 * layers * hidden * seq_len. MFU = that * tokens/s / --peak
(loom-device-peaks "$(nvidia-smi name)" bf16).

  torch_llama_step.py --peak 989.5e12 --json out.json           # the 1B config, CUDA
  torch_llama_step.py --device cpu --tiny --steps 3 --warmup 1   # runs anywhere (torch >= 1.13)
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight).to(x.dtype)


def rope_tables(seq, head_dim, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    angles = torch.outer(torch.arange(seq, device=device).float(), inv)  # (S, D/2)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    # x: (B, H, S, D); rotates the two halves of each head (the HF Llama layout).
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d].float(), x[..., d:].float()
    c, s = cos[None, None], sin[None, None]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


_SDPA = getattr(F, "scaled_dot_product_attention", None)
_SDPA_GQA = None  # whether SDPA takes enable_gqa (torch >= 2.5); probed on first use;
                  # --gqa repeat sets it False (k/v repeated to all heads instead)


def attention(q, k, v):
    """Causal attention, q: (B, H, S, D), k/v: (B, KV, S, D)."""
    global _SDPA_GQA
    groups = q.shape[1] // k.shape[1]
    if _SDPA is not None:
        if groups > 1 and _SDPA_GQA is not False:
            try:
                out = _SDPA(q, k, v, is_causal=True, enable_gqa=True)
                _SDPA_GQA = True
                return out
            except TypeError:
                _SDPA_GQA = False
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return _SDPA(q, k, v, is_causal=True)
    # torch < 2.0: the plain formula.
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    s = q.shape[2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.kv_heads = c.heads, c.kv_heads
        self.head_dim = c.hidden // c.heads
        self.attn_norm = RMSNorm(c.hidden, c.norm_eps)
        self.q = nn.Linear(c.hidden, c.heads * self.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(c.heads * self.head_dim, c.hidden, bias=False)
        self.mlp_norm = RMSNorm(c.hidden, c.norm_eps)
        self.gate = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = attention(q, k, v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(a)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden, c.norm_eps)
        self.head = nn.Linear(c.hidden, c.vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets, cos, sin):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def model_flops_per_token(c, num_parameters):
    matmul_params = num_parameters - c.vocab * c.hidden  # untied: the input embedding is no matmul
    return 6.0 * matmul_params + 12.0 * c.layers * c.hidden * c.seq


def make_optimizer(model, lr, device):
    kwargs = dict(lr=lr, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8)
    if device.type == "cuda":
        try:
            return torch.optim.AdamW(model.parameters(), fused=True, **kwargs), "fused"
        except (TypeError, RuntimeError):
            pass
    try:
        return torch.optim.AdamW(model.parameters(), foreach=True, **kwargs), "foreach"
    except TypeError:
        return torch.optim.AdamW(model.parameters(), **kwargs), "plain"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="a small config that runs on a CPU")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--norm-eps", type=float, default=1e-5)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--autocast", default="bf16", choices=["bf16", "none"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the model first")
    ap.add_argument("--gqa", default="native", choices=["native", "repeat"],
                    help="SDPA's enable_gqa (where torch has it), or k/v repeated to every head")
    ap.add_argument("--peak", type=float, default=0.0, help="dense peak FLOP/s for MFU (0: no MFU)")
    ap.add_argument("--json", help="write the result object here too")
    c = ap.parse_args()
    if c.tiny:
        c.vocab, c.hidden, c.layers, c.heads, c.kv_heads, c.ffn, c.seq = 256, 128, 2, 4, 2, 384, 64
        c.global_batch, c.micro_batch = 4, 2
    if c.global_batch % c.micro_batch:
        sys.exit("torch_llama_step.py: --global-batch must be a multiple of --micro-batch")
    if c.device == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_llama_step.py: --device cuda but torch sees no GPU")
    device = torch.device(c.device)
    if c.gqa == "repeat":
        global _SDPA_GQA
        _SDPA_GQA = False
    torch.manual_seed(1234)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # only fp32 matmuls outside autocast

    model = Llama(c).to(device)
    num_parameters = sum(p.numel() for p in model.parameters())
    flops_per_token = model_flops_per_token(c, num_parameters)
    optimizer, adamw_kind = make_optimizer(model, c.lr, device)
    step_model = torch.compile(model) if c.compile else model
    cos, sin = rope_tables(c.seq, c.hidden // c.heads, c.rope_theta, device)
    accum = c.global_batch // c.micro_batch
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [torch.randint(0, c.vocab, (c.micro_batch, c.seq + 1), generator=gen).to(device)
               for _ in range(accum)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def train_step():
        total = 0.0
        for window in batches:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                enabled=c.autocast == "bf16"):
                loss = step_model(window[:, :-1], window[:, 1:], cos, sin) / accum
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    losses, times = [], []
    for i in range(c.warmup + c.steps):
        sync()
        t0 = time.perf_counter()
        loss = train_step()
        sync()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if i >= c.warmup:
            times.append(dt)
        print(f"torch step {i + 1}/{c.warmup + c.steps} loss {losses[-1]:.4f} step_s {dt:.4f}"
              + (" (warm-up)" if i < c.warmup else ""), flush=True)

    step_s = statistics.median(times)
    tokens_per_step = c.global_batch * c.seq
    result = {
        "impl": "pytorch",
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "sdpa": "none" if _SDPA is None else ("enable_gqa" if _SDPA_GQA else "repeat_kv"),
        "adamw": adamw_kind,
        "compiled": c.compile,
        "autocast": c.autocast,
        "config": {k: getattr(c, k) for k in ("vocab", "hidden", "layers", "heads", "kv_heads",
                                               "ffn", "seq", "global_batch", "micro_batch")},
        "parameters": num_parameters,
        "flops_per_token": flops_per_token,
        "timed_steps": len(times),
        "step_seconds_median": step_s,
        "tokens_per_second": tokens_per_step / step_s,
        "mfu": flops_per_token * tokens_per_step / step_s / c.peak if c.peak > 0 else None,
        "peak_flops": c.peak or None,
        "losses": losses,
        "max_memory_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
    }
    line = json.dumps(result)
    print("RESULT " + line, flush=True)
    if c.json:
        with open(c.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
