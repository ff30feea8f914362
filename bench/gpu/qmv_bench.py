#!/usr/bin/env python3
"""Microbenchmark of lmx's CUDA quantized matmul (src/kernels/cuda/qmv.cuh, read at run time and
compiled through mx.fast.cuda_kernel with the body lmx's C++ wrapper uses) against
mx.quantized_matmul, on decode shapes of Qwen3-4B / 8B, in one process.

Each measurement cycles through enough copies of the weight that they do not fit the GPU's L2
(every call streams its weight from HBM), runs WARMUP calls, then CALLS calls in one eval between
two marker kernels, each call's input made to depend on the previous call's output (a decode
step's order; independent calls would overlap on the GPU). Wall time per call is printed; run under bench/gpu/ktrace.cpp's tracer
(LD_PRELOAD, LMX_KTRACE=trace.csv), `--report trace.csv` then gives each measurement's GPU time
per call (the kernels between its markers) and its fraction of the copy bandwidth measured the
same way in the same process.

Variants (--variants WARPS:UNROLL[:PIPE],...) compile the same source with qmv.cuh's LMX_QMV_WARPS,
LMX_QMV_UNROLL and LMX_QMV_PIPE set; the first is reported as "lmx", the others as
"lmx-w<W>u<U>[p]".

usage: qmv_bench.py [--plan plan.json] [--shapes KxN,...] [--rows 1,4,8,16] [--layouts 4:64,...]
                    [--variants 8:4,8:4:1,...]
       qmv_bench.py --report trace.csv --plan plan.json
"""
import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BODY = ("lmx_qmv<T, BITS, GS, TT>(x, w, scales, biases, out, lmx_qmv_rows(x_shape, x_ndim), "
        "w_shape[0], x_shape[x_ndim - 1]);")
MARK = "custom_kernel_lmx_mark"
# K x N: Qwen3-4B gate/up and down, Qwen3-8B gate/up and down
SHAPES = "2560x9728,9728x2560,4096x12288,12288x4096"


def run(a):
    import mlx.core as mx

    src = (ROOT / "src/kernels/cuda/qmv.cuh").read_text()
    variants = []
    for i, v in enumerate(a.variants.split(",")):
        W, U, P = ([int(t) for t in v.split(":")] + [0])[:3]
        head = (f"#define LMX_QMV_WARPS {W}\n#define LMX_QMV_UNROLL {U}\n"
                f"#define LMX_QMV_PIPE {P}\n" + src)
        tag = f"w{W}u{U}" + ("p" if P else "")
        variants.append(("lmx" if i == 0 else f"lmx-{tag}", W,
                         mx.fast.cuda_kernel(f"lmx_qmv_{tag}", ["x", "w", "scales", "biases"],
                                             ["out"], BODY, header=head, ensure_row_contiguous=True)))
    mark_k = mx.fast.cuda_kernel("lmx_mark", ["a"], ["o"], "o[0] = a[0];")
    token = mx.zeros((1,), dtype=mx.float32)

    def mark():
        mx.eval(mark_k(inputs=[token], output_shapes=[(1,)], output_dtypes=[mx.float32],
                       grid=(1, 1, 1), threadgroup=(1, 1, 1))[0])

    def lmx_qmv(x, w, s, b, bits, gs, variant=0):
        M, K = x.shape
        N = w.shape[0]
        _, W, kern = variants[variant]
        return kern(inputs=[x, w, s, b],
                    template=[("T", x.dtype), ("BITS", bits), ("GS", gs), ("TT", 2 if M > 8 else 1)],
                    grid=(N // 16 * 32 * W, 1, 1), threadgroup=(32 * W, 1, 1),
                    output_shapes=[(M, N)], output_dtypes=[x.dtype])[0]

    plan = []

    def timed(name, fn, copies, bytes_per_call, extra, calls=None, x=None):
        calls = calls or a.calls
        for i in range(a.warmup):
            mx.eval(fn(copies[i % len(copies)], x))
        # With x, each call's input depends on the previous call's output (x + 0 * out[:, :1]), as
        # in a decode step: independent calls would run concurrently on the GPU.
        outs, prev = [], None
        for i in range(calls):
            xi = x if x is None or prev is None else mx.add(x, mx.multiply(prev[:, :1], 0))
            prev = fn(copies[i % len(copies)], xi)
            outs.append(prev)
        mark()
        t0 = time.perf_counter()
        mx.eval(outs)
        wall = (time.perf_counter() - t0) / calls
        mark()
        del outs
        rec = dict(extra, impl=name, calls=calls, wall_us=wall * 1e6, bytes=bytes_per_call,
                   wall_gbps=bytes_per_call / wall / 1e9)
        plan.append(rec)
        print(json.dumps(rec), flush=True)

    # Copy bandwidth: read + write of 1 GiB, elementwise.
    big = mx.zeros((1 << 28,), dtype=mx.uint32)
    mx.eval(big)
    zero = mx.array(0, dtype=mx.uint32)
    timed("copy", lambda t, _: mx.add(t, zero), [big], 2 * big.nbytes, {"kind": "copy"}, calls=8)
    del big

    layouts = [tuple(int(v) for v in l.split(":")) for l in a.layouts.split(",")]
    dtype = {"bfloat16": mx.bfloat16, "float16": mx.float16}[a.dtype]
    t_start = time.time()
    for shape in a.shapes.split(","):
        K, N = (int(v) for v in shape.split("x"))
        for bits, gs in layouts:
            wf = (mx.random.normal((N, K), key=mx.random.key(K + N + bits)) * 0.02).astype(dtype)
            q = mx.quantize(wf, gs, bits)
            mx.eval(q)
            wbytes = sum(t.nbytes for t in q)
            n_copies = max(2, -(-a.l2_bytes * 4 // wbytes))
            copies = [tuple(t + mx.array(0, t.dtype) for t in q) for _ in range(n_copies)]
            mx.eval(copies)
            for M in (int(r) for r in a.rows.split(",")):
                x = mx.random.normal((M, K), key=mx.random.key(M)).astype(dtype)
                mx.eval(x)
                want = mx.quantized_matmul(x, *q, transpose=True, group_size=gs, bits=bits)
                want = want.astype(mx.float32)
                nbytes = wbytes + 2 * x.nbytes
                for vi, (vname, _, _) in enumerate(variants):
                    got = lmx_qmv(x, *q, bits, gs, vi).astype(mx.float32)
                    # ||lmx - MLX|| / ||MLX||: bfloat16 weight rounding lands between 1e-3 and 1e-2
                    err = mx.sqrt(mx.sum((got - want) ** 2) / mx.sum(want ** 2))
                    extra = {"kind": "qmv", "K": K, "N": N, "M": M, "bits": bits, "gs": gs,
                             "dtype": a.dtype, "norm_err_vs_mlx": err.item(),
                             "finite": bool(mx.all(mx.isfinite(got)).item())}
                    timed(vname, lambda c, xi: lmx_qmv(xi, *c, bits, gs, vi), copies, nbytes, extra,
                          x=x)
                if time.time() - t_start < a.mlx_budget:
                    timed("mlx", lambda c, xi: mx.quantized_matmul(xi, *c, transpose=True,
                                                                   group_size=gs, bits=bits),
                          copies, nbytes, extra, x=x)
            del copies
    if a.plan:
        Path(a.plan).write_text(json.dumps(plan))


def report(a):
    plan = json.loads(Path(a.plan).read_text())
    rows = []
    with open(a.report) as f:
        for r in csv.DictReader(f):
            if r["kind"] == "K":
                rows.append((int(r["start_ns"]), int(r["end_ns"]), r["name"]))
    rows.sort()
    # Segments between consecutive pairs of markers, in order: one per plan entry.
    marks = [i for i, r in enumerate(rows) if MARK in r[2]]
    segs = [(marks[2 * i], marks[2 * i + 1]) for i in range(len(marks) // 2)]
    if len(segs) != len(plan):
        sys.exit(f"report: {len(segs)} marked segments in the trace, {len(plan)} in the plan")
    copy_gbps = None
    out = []
    for rec, (i, j) in zip(plan, segs):
        ks = rows[i + 1:j]
        # The matmul kernels only: not the dependency chain's elementwise ops (binary_*).
        mm = ks if rec["kind"] == "copy" else [k for k in ks if "binary" not in k[2]]
        busy = sum(e - s for s, e, _ in mm) / rec["calls"]
        span = (ks[-1][1] - ks[0][0]) / rec["calls"] if ks else float("nan")
        rec = dict(rec, gpu_us=busy / 1e3, span_us=span / 1e3, kernels_per_call=len(mm) / rec["calls"],
                   kernel=mm[0][2][:60] if mm else "")
        rec["gbps"] = rec["bytes"] / busy
        if rec["kind"] == "copy":
            copy_gbps = rec["gbps"]
        rec["bw_frac"] = rec["gbps"] / copy_gbps if copy_gbps else None
        out.append(rec)
        print(json.dumps(rec), flush=True)
    # The table: per shape and layout, lmx and MLX per row count, and 16 rows over 1 row.
    print(f"\ncopy bandwidth: {copy_gbps:.0f} GB/s\n")
    print("| K x N | bits/gs | rows | lmx us | lmx % copy | MLX us | MLX % copy | lmx speedup | norm err vs MLX |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    by = {}
    for r in out:
        if r["kind"] == "qmv":
            by.setdefault((r["K"], r["N"], r["bits"], r["gs"], r["M"]), {})[r["impl"]] = r
    for (K, N, bits, gs, M), d in by.items():
        l, m = d.get("lmx"), d.get("mlx")
        f = lambda r, k, s: s.format(r[k]) if r else "-"  # noqa: E731
        sp = f"{m['gpu_us'] / l['gpu_us']:.2f}x" if l and m else "-"
        print(f"| {K}x{N} | {bits}/{gs} | {M} | {f(l, 'gpu_us', '{:.1f}')} | "
              f"{f(l, 'bw_frac', '{:.0%}')} | {f(m, 'gpu_us', '{:.1f}')} | {f(m, 'bw_frac', '{:.0%}')} | "
              f"{sp} | {f(l, 'norm_err_vs_mlx', '{:.2e}')} |")
    others = sorted({i for d in by.values() for i in d if i not in ("lmx", "mlx")})
    if others:
        print("\nvariants, GPU us per call (lmx = the first of --variants):")
        print("| K x N | bits/gs | rows | lmx | " + " | ".join(others) + " |")
        print("|---" * (4 + len(others)) + "|")
        for (K, N, bits, gs, M), d in by.items():
            cells = [f"{d[i]['gpu_us']:.1f}" if i in d else "-" for i in ["lmx"] + others]
            print(f"| {K}x{N} | {bits}/{gs} | {M} | " + " | ".join(cells) + " |")
    print("\n16 rows / 1 row (lmx GPU time):")
    for (K, N, bits, gs, M), d in by.items():
        if M == 16 and (K, N, bits, gs, 1) in by and "lmx" in d:
            one = by[(K, N, bits, gs, 1)]["lmx"]["gpu_us"]
            print(f"  {K}x{N} {bits}/{gs}: {d['lmx']['gpu_us'] / one:.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan")
    ap.add_argument("--report")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--layouts", default="4:64,4:32,8:64")
    ap.add_argument("--variants", default="8:4", help="WARPS:UNROLL[:PIPE] of qmv.cuh, the first is 'lmx'")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--l2-bytes", type=int, default=64 << 20)
    ap.add_argument("--mlx-budget", type=float, default=1e9,
                    help="seconds after which MLX's side is no longer measured (JIT compiles)")
    a = ap.parse_args()
    report(a) if a.report else run(a)


if __name__ == "__main__":
    main()
