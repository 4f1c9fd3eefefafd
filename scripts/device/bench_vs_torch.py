#!/usr/bin/env python3
"""Benchmarks Loom's CUDA kernels against their PyTorch baselines on one GPU.

Our kernels are called through ctypes (libloom_cuda_capi.so) on the same
torch tensors and timed the same way as the baselines (CUDA events, warm-up,
median). Each section also checks our results against an independent fp32
computation on the device before timing, and prints that error.

  bench_vs_torch.py --lib build-device/libloom_cuda_capi.so --section attention --json out.jsonl
  bench_vs_torch.py --lib ... --section fp8 --json out.jsonl
  bench_vs_torch.py --table out.jsonl          # the one table, from all sections

Sections run in separate processes so that a crash in one (a sticky CUDA
error) still leaves the others' rows.
"""
import argparse
import ctypes
import json
import math
import sys


def load_lib(path):
    lib = ctypes.CDLL(path)
    vp, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.loom_attention_forward.argtypes = [vp, vp, vp, vp, vp, i, i, i, i, i, i, i, f, i, vp]
    lib.loom_attention_backward_workspace.argtypes = [i, i, i, i, i, i]
    lib.loom_attention_backward_workspace.restype = ctypes.c_size_t
    lib.loom_attention_backward.argtypes = [vp] * 10 + [i, i, i, i, i, i, i, f, vp]
    lib.loom_quantize_activation.argtypes = [vp, i, i, i, vp, vp, vp]
    lib.loom_quantize_weight_bf16.argtypes = [vp, i, i, i, vp, vp, vp]
    lib.loom_fp8_gemm.argtypes = [vp, vp, vp, vp, i, i, i, i, vp, i, vp]
    for fn in (lib.loom_attention_forward, lib.loom_attention_backward, lib.loom_quantize_activation,
               lib.loom_quantize_weight_bf16, lib.loom_fp8_gemm):
        fn.restype = ctypes.c_int
    return lib


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: cudaError {rc}")


def bench_ms(torch, fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def rel_err(torch, got, want):
    got, want = got.float(), want.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def emit(out, **row):
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")


def attention(lib, torch, out):
    import torch.nn.functional as F
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        SDPBackend = sdpa_kernel = None
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    h, d = 16, 128

    def ours_fwd(q, k, v, o, lse, causal, bm=0):
        b, s = q.shape[0], q.shape[1]
        check(lib.loom_attention_forward(ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), b, s, s, h, h, d, int(causal),
                                         1.0 / math.sqrt(d), bm, stream()), "attention forward")

    def ours_bwd(q, k, v, o, lse, do, dq, dk, dv, ws, causal):
        b, s = q.shape[0], q.shape[1]
        check(lib.loom_attention_backward(ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), ptr(do), ptr(dq), ptr(dk), ptr(dv),
                                          ptr(ws), b, s, s, h, h, d, int(causal), 1.0 / math.sqrt(d), stream()),
              "attention backward")

    # Correctness on the device against fp32 autograd (math backend), s = 1024.
    for causal in (False, True):
        b, s = 2, 1024
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, h, s), float("nan"), device="cuda")
        ours_fwd(q, k, v, o, lse, causal)
        ws = torch.empty(lib.loom_attention_backward_workspace(b, s, s, h, h, d), dtype=torch.uint8, device="cuda")
        dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(3))
        ours_bwd(q, k, v, o, lse, do, dq, dk, dv, ws, causal)
        torch.cuda.synchronize()
        qf, kf, vf = (t.float().transpose(1, 2).requires_grad_() for t in (q, k, v))
        of = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
        gq, gk, gv = torch.autograd.grad(of, (qf, kf, vf), do.float().transpose(1, 2))
        lse_ref = torch.logsumexp((qf @ kf.transpose(-1, -2) / math.sqrt(d)).masked_fill(
            torch.triu(torch.ones(s, s, dtype=torch.bool, device="cuda"), 1) if causal else
            torch.zeros(s, s, dtype=torch.bool, device="cuda"), float("-inf")), dim=-1)
        errs = {"out": rel_err(torch, o.transpose(1, 2), of), "lse": (lse - lse_ref).abs().max().item(),
                "dq": rel_err(torch, dq.transpose(1, 2), gq), "dk": rel_err(torch, dk.transpose(1, 2), gk),
                "dv": rel_err(torch, dv.transpose(1, 2), gv)}
        emit(out, kind="check", kernel="attention", causal=causal, errors=errs,
             ok=errs["out"] < 1e-2 and errs["lse"] < 2e-3 and max(errs["dq"], errs["dk"], errs["dv"]) < 2e-2)

    backends = [("sdpa", None)]
    if SDPBackend is not None:
        backends += [("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)]
    for s in (1024, 2048, 4096, 8192, 16384):
        b = max(1, 16384 // s)
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda")
        ws = torch.empty(lib.loom_attention_backward_workspace(b, s, s, h, h, d), dtype=torch.uint8, device="cuda")
        dq, dk, dv = (torch.empty_like(q) for _ in range(3))
        for causal in (False, True):
            flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
            shape = f"b{b} s{s} h{h} d{d} {'causal' if causal else 'full'}"
            for bm in (64, 128):
                ms = bench_ms(torch, lambda: ours_fwd(q, k, v, o, lse, causal, bm))
                emit(out, kind="time", kernel="attention fwd", impl=f"loom bm{bm}", shape=shape, ms=ms,
                     tflops=flops / ms / 1e9, seq=s, causal=causal)
            ours_fwd(q, k, v, o, lse, causal)
            ms = bench_ms(torch, lambda: ours_bwd(q, k, v, o, lse, do, dq, dk, dv, ws, causal))
            emit(out, kind="time", kernel="attention bwd", impl="loom", shape=shape, ms=ms,
                 tflops=2.5 * flops / ms / 1e9, seq=s, causal=causal)
            qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
            dot = do.transpose(1, 2)
            for name, backend in backends:
                try:
                    ctx = sdpa_kernel([backend]) if backend is not None else None
                    if ctx:
                        ctx.__enter__()
                    try:
                        fwd = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        ms = bench_ms(torch, fwd)
                        emit(out, kind="time", kernel="attention fwd", impl=name, shape=shape, ms=ms,
                             tflops=flops / ms / 1e9, seq=s, causal=causal)
                        res = fwd()
                        ms = bench_ms(torch, lambda: torch.autograd.grad(res, (qt, kt, vt), dot, retain_graph=True))
                        emit(out, kind="time", kernel="attention bwd", impl=name, shape=shape, ms=ms,
                             tflops=2.5 * flops / ms / 1e9, seq=s, causal=causal)
                    finally:
                        if ctx:
                            ctx.__exit__(None, None, None)
                except Exception as e:  # a backend this build or GPU lacks
                    emit(out, kind="note", kernel="attention", impl=name, shape=shape, note=str(e)[:200])
        del q, k, v, do, o, lse, ws, dq, dk, dv
        torch.cuda.empty_cache()


def fp8(lib, torch, out):
    stream = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def quantize(x, w):
        m, k = x.shape
        n = w.shape[0]
        qa = torch.empty(m, k, dtype=torch.uint8, device="cuda")
        sa = torch.empty(k // 128, m, device="cuda")
        qb = torch.empty(n, k, dtype=torch.uint8, device="cuda")
        sb = torch.empty(n // 128, k // 128, device="cuda")
        check(lib.loom_quantize_activation(ptr(x), m, k, 0, ptr(qa), ptr(sa), stream()), "quantize activation")
        check(lib.loom_quantize_weight_bf16(ptr(w), n, k, 0, ptr(qb), ptr(sb), stream()), "quantize weight")
        return qa, sa, qb, sb

    def dequant(q, scales_rows):  # scales_rows: [rows, k/128] per-row-block scale
        vals = q.view(torch.float8_e4m3fn).float()
        return (vals.view(q.shape[0], -1, 128) * scales_rows.unsqueeze(-1)).view(q.shape)

    def ours(qa, sa, qb, sb, d, m, n, k, impl):
        check(lib.loom_fp8_gemm(ptr(qa), ptr(sa), ptr(qb), ptr(sb), 0, m, n, k, ptr(d), impl, stream()), "fp8 gemm")

    impls = ((1, "loom mma.sync"), (2, "loom wgmma"))
    # Correctness against fp32 matmul of the dequantized operands.
    m, n, k = 512, 768, 1024
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
    qa, sa, qb, sb = quantize(x, w)
    a_deq = dequant(qa, sa.t())
    b_deq = dequant(qb, sb.repeat_interleave(128, dim=0))
    want = a_deq @ b_deq.t()
    for impl, name in impls:
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        ours(qa, sa, qb, sb, d, m, n, k, impl)
        torch.cuda.synchronize()
        err = rel_err(torch, d, want)
        emit(out, kind="check", kernel="fp8 gemm", impl=name, errors={"vs dequantized fp32": err,
             "vs bf16 inputs": rel_err(torch, d, x.float() @ w.float().t())}, ok=err < 5e-3)

    for (m, n, k) in ((4096, 4096, 4096), (8192, 8192, 4096), (8192, 8192, 8192)):
        shape = f"{m}x{n}x{k}"
        flops = 2.0 * m * n * k
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        qa, sa, qb, sb = quantize(x, w)
        d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for impl, name in impls:
            ms = bench_ms(torch, lambda: ours(qa, sa, qb, sb, d, m, n, k, impl))
            emit(out, kind="time", kernel="fp8 gemm", impl=name, shape=shape, ms=ms, tflops=flops / ms / 1e9)
        ms = bench_ms(torch, lambda: torch.matmul(x, w.t()))
        emit(out, kind="time", kernel="fp8 gemm", impl="torch.matmul bf16", shape=shape, ms=ms, tflops=flops / ms / 1e9)
        a8 = qa.view(torch.float8_e4m3fn)
        b8 = qb.view(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        variants = [("torch._scaled_mm tensorwise", one, one),
                    ("torch._scaled_mm rowwise", torch.ones(m, 1, device="cuda"), torch.ones(1, n, device="cuda"))]
        # Blockwise (1x128 x 128x128, DeepSeek's recipe) where this torch/cuBLAS offers it.
        variants.append(("torch._scaled_mm blockwise", sa.t().contiguous(), sb.t().contiguous()))
        for name, s_a, s_b in variants:
            try:
                fn = lambda: torch._scaled_mm(a8, b8.t(), scale_a=s_a, scale_b=s_b, out_dtype=torch.bfloat16)
                fn()
                ms = bench_ms(torch, fn)
                emit(out, kind="time", kernel="fp8 gemm", impl=name, shape=shape, ms=ms, tflops=flops / ms / 1e9)
            except Exception as e:
                emit(out, kind="note", kernel="fp8 gemm", impl=name, shape=shape, note=str(e)[:200])
        del x, w, qa, sa, qb, sb, d
        torch.cuda.empty_cache()


def table(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    print("\n== correctness on the device (relative Frobenius error vs fp32; lse: max abs) ==")
    for r in rows:
        if r["kind"] == "check":
            errs = ", ".join(f"{k} {v:.2e}" for k, v in r["errors"].items())
            tag = r.get("impl", "causal" if r.get("causal") else "full")
            print(f"  {'PASS' if r['ok'] else 'FAIL'}  {r['kernel']:<14} {tag:<16} {errs}")
    notes = [r for r in rows if r["kind"] == "note"]
    for r in notes:
        print(f"  note: {r['kernel']} {r['impl']} {r.get('shape', '')}: {r['note']}")
    times = [r for r in rows if r["kind"] == "time"]
    best = {}
    for r in times:  # best loom variant and each baseline per (kernel, shape)
        key = (r["kernel"], r["shape"])
        best.setdefault(key, {})
        impl = "loom" if r["impl"].startswith("loom") else r["impl"]
        cur = best[key].get(impl)
        if cur is None or r["ms"] < cur["ms"]:
            best[key][impl] = r
    print("\n== Loom CUDA kernels vs baselines (TFLOP/s; ratio = loom / baseline) ==")
    print(f"{'kernel':<14} {'shape':<28} {'loom (variant)':<26} {'baseline':<28} {'TFLOP/s':>8} {'ratio':>6}")
    for (kernel, shape), impls in best.items():
        loom = impls.get("loom")
        for name, r in impls.items():
            if name == "loom":
                continue
            lt = f"{loom['tflops']:7.1f} ({loom['impl'][5:]})" if loom else "n/a"
            ratio = f"{loom['tflops'] / r['tflops']:.2f}" if loom else "n/a"
            print(f"{kernel:<14} {shape:<28} {lt:<26} {name:<28} {r['tflops']:8.1f} {ratio:>6}")
    print("\nall rows:")
    for r in times:
        print(f"  {r['kernel']:<14} {r['shape']:<28} {r['impl']:<28} {r['ms']:9.3f} ms {r['tflops']:8.1f} TFLOP/s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib")
    ap.add_argument("--section", choices=["attention", "fp8"])
    ap.add_argument("--json")
    ap.add_argument("--table")
    args = ap.parse_args()
    if args.table:
        table(args.table)
        return
    import torch
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device")
        return
    torch.manual_seed(0)
    lib = load_lib(args.lib)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    {"attention": attention, "fp8": fp8}[args.section](lib, torch, args.json)


if __name__ == "__main__":
    sys.exit(main())
