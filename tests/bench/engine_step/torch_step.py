#!/usr/bin/python3
"""PyTorch side of the engine-step benchmark: the same Llama (RMSNorm, RoPE in
Hugging Face's rotate-half form, grouped-query causal attention, SwiGLU,
untied LM head, no biases) and the same step (zero_grad, forward, mean
cross-entropy, backward, AdamW with decay on matrices only) as
engine_step_bench.cc, on the same thread count. Prints one JSON line.

usage: /usr/bin/python3 torch_step.py [--threads N] [--steps N] [--batch 8] [--seq 256]
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads, self.kv_heads = a.heads, a.kv_heads
        self.hd = a.hidden // a.heads
        self.input_layernorm = RMSNorm(a.hidden, 1e-5)
        self.q_proj = nn.Linear(a.hidden, a.heads * self.hd, bias=False)
        self.k_proj = nn.Linear(a.hidden, a.kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(a.hidden, a.kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(a.heads * self.hd, a.hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(a.hidden, 1e-5)
        self.gate_proj = nn.Linear(a.hidden, a.ffn, bias=False)
        self.up_proj = nn.Linear(a.hidden, a.ffn, bias=False)
        self.down_proj = nn.Linear(a.ffn, a.hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, s, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd) + mask
        attn = torch.matmul(torch.softmax(scores, dim=-1), v)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden, 1e-5)
        self.lm_head = nn.Linear(a.hidden, a.vocab, bias=False)
        hd = a.hidden // a.heads
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(a.seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())
        self.register_buffer("mask", torch.full((a.seq, a.seq), float("-inf")).triu(1))

    def forward(self, ids, targets):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin, self.mask)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("threads", 2), ("steps", 5), ("batch", 8), ("seq", 256), ("vocab", 256),
                          ("hidden", 384), ("layers", 6), ("heads", 6), ("kv_heads", 2),
                          ("ffn", 1024)]:
        p.add_argument("--" + name, type=int, default=default)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    model = Llama(a)
    with torch.no_grad():  # the same init scheme as Loom's InitParameters
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * a.layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                p.normal_(0.0, std)
    params = sum(p.numel() for n, p in model.named_parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    idx = torch.arange(a.batch * a.seq, dtype=torch.int64)
    ids = ((idx * 7919 + 13) % a.vocab).view(a.batch, a.seq)
    targets = ((idx * 104729 + 7) % a.vocab).view(a.batch, a.seq)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = model(ids, targets)
        loss.backward()
        opt.step()
        return loss.item()

    step()
    times, cpu = [], []
    for _ in range(a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    times.sort()
    cpu.sort()
    print(json.dumps({"impl": "torch", "version": torch.__version__, "threads": a.threads,
                      "params": params, "batch": a.batch, "seq": a.seq,
                      "step_ms": round(times[len(times) // 2] * 1e3, 2),
                      "min_ms": round(times[0] * 1e3, 2),
                      "cpu_ms": round(cpu[len(cpu) // 2] * 1e3, 2), "loss": round(loss, 6)}))


if __name__ == "__main__":
    main()
