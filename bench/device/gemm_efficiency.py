"""Measured bf16 GEMM throughput by shape, for the step-time model.

Times torch.matmul of [M, K] x [K, N] (bf16 in, bf16 out) with CUDA events,
ten timed runs after three warm-ups, on the shapes a transformer layer runs
(hidden 4096/8192, FFN 14336/28672, TP 1/2/4/8 slices, tokens 1K..16K) and on
skinny ones. Prints TSV: m n k tflops.

Run on a CUDA machine: python3 bench/device/gemm_efficiency.py [OUT.tsv]
"""
import sys

import torch


def tflops(m, n, k, reps=10):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / reps
    return 2.0 * m * n * k / seconds / 1e12


def shapes():
    for tokens in (1024, 4096, 8192, 16384):
        for hidden, ffn in ((4096, 14336), (8192, 28672)):
            for tp in (1, 2, 4, 8):
                yield tokens, 3 * hidden // tp, hidden      # fused QKV-like
                yield tokens, hidden, hidden // tp          # output projection
                yield tokens, 2 * ffn // tp, hidden         # gated FC1
                yield tokens, hidden, ffn // tp             # FC2
    for m in (16, 64, 128, 256, 512):                       # skinny: few tokens per expert
        yield m, 4096, 4096
        yield m, 2048, 7168


def main():
    rows = [f"{m}\t{n}\t{k}\t{tflops(m, n, k):.1f}" for m, n, k in shapes()]
    text = "m\tn\tk\ttflops\n" + "\n".join(rows) + "\n"
    print(torch.cuda.get_device_name(0))
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
