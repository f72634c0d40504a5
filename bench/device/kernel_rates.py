"""Measured kernel rates for the step-time model, beside gemm_efficiency.py.

On one GPU, with CUDA events (warm-ups, then timed repetitions):
- hbm: a 1 GiB bf16 copy and a bf16 multiply (bytes moved / time);
- attention: scaled_dot_product_attention, causal, GQA 32/8 heads of 128,
  forward and forward+backward, per backend PyTorch offers (TFLOP/s on the
  causal FLOPs 2*b*h*s^2*d forward, 2.5x that backward);
- fp8: torch._scaled_mm with tensorwise scales on transformer shapes;
- layer: one Llama-3-8B-shaped transformer layer (RMSNorm, QKV, RoPE, SDPA,
  O, RMSNorm, SwiGLU MLP; h 4096, 32/8 heads, ffn 14336) in eager PyTorch at
  b=1, s=8192, bf16: forward and forward+backward seconds; again under
  torch.compile when it compiles.
Prints one JSON object. Run: python3 bench/device/kernel_rates.py [OUT.json]
"""
import json
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, reps=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def hbm():
    n = 1 << 29  # 1 GiB of bf16
    x = torch.empty(n, device="cuda", dtype=torch.bfloat16).normal_()
    y = torch.empty_like(x)
    z = torch.empty_like(x)
    copy_s = timed(lambda: y.copy_(x))
    mul_s = timed(lambda: torch.mul(x, y, out=z))
    return {"copy_gbps": 2 * 2 * n / copy_s / 1e9, "mul_gbps": 3 * 2 * n / mul_s / 1e9}


def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        for s in (2048, 4096, 8192):
            b, hq, hkv, d = 1, 32, 8, 128
            q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            fwd_flops = 2.0 * b * hq * s * s * d  # causal: half of 4*b*h*s^2*d
            try:
                with sdpa_kernel(backend):
                    f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    fwd = timed(f)
                    o = f()
                    g = torch.randn_like(o)
                    fb = timed(lambda: torch.autograd.grad(f(), (q, k, v), g))
                out.append({"backend": backend.name, "s": s, "fwd_tflops": fwd_flops / fwd / 1e12,
                            "bwd_tflops": 2.5 * fwd_flops / (fb - fwd) / 1e12, "fwd_s": fwd, "fwd_bwd_s": fb})
            except Exception as e:  # a backend this build lacks
                out.append({"backend": backend.name, "s": s, "error": str(e)[:200]})
    return out


def fp8():
    out = []
    for m, n, k in ((8192, 4096, 4096), (8192, 6144, 4096), (8192, 28672, 4096), (8192, 4096, 14336),
                    (16384, 8192, 8192), (1024, 4096, 4096)):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        bt = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device="cuda")
        try:
            s = timed(lambda: torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            ab, bb = a.to(torch.bfloat16), bt.to(torch.bfloat16).t()
            s16 = timed(lambda: ab @ bb)
            out.append({"m": m, "n": n, "k": k, "fp8_tflops": 2.0 * m * n * k / s / 1e12,
                        "bf16_tflops": 2.0 * m * n * k / s16 / 1e12})
        except Exception as e:
            out.append({"m": m, "n": n, "k": k, "error": str(e)[:200]})
    return out


class Layer(torch.nn.Module):
    def __init__(self, h=4096, hq=32, hkv=8, d=128, ffn=14336):
        super().__init__()
        self.hq, self.hkv, self.d = hq, hkv, d
        self.n1 = torch.nn.RMSNorm(h)
        self.qkv = torch.nn.Linear(h, (hq + 2 * hkv) * d, bias=False)
        self.o = torch.nn.Linear(hq * d, h, bias=False)
        self.n2 = torch.nn.RMSNorm(h)
        self.w13 = torch.nn.Linear(h, 2 * ffn, bias=False)
        self.w2 = torch.nn.Linear(ffn, h, bias=False)

    def rope(self, x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        qkv = self.qkv(self.n1(x))
        q, k, v = qkv.split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = self.rope(q.view(b, s, self.hq, self.d), cos, sin).transpose(1, 2)
        k = self.rope(k.view(b, s, self.hkv, self.d), cos, sin).transpose(1, 2)
        v = v.view(b, s, self.hkv, self.d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        g, u = self.w13(self.n2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(g) * u)


def layer():
    b, s = 1, 8192
    m = Layer().cuda().to(torch.bfloat16)
    x = torch.randn(b, s, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    ang = torch.randn(s, 1, 64, device="cuda", dtype=torch.bfloat16)
    cos, sin = ang.cos(), ang.sin()
    out = {"b": b, "s": s}
    for name, fn in (("eager", m),):
        out[name + "_fwd_s"] = timed(lambda: fn(x, cos, sin))
        out[name + "_fwd_bwd_s"] = timed(lambda: fn(x, cos, sin).sum().backward())
    try:
        t0 = time.time()
        c = torch.compile(m)
        c(x, cos, sin).sum().backward()
        out["compile_s"] = time.time() - t0
        out["compiled_fwd_s"] = timed(lambda: c(x, cos, sin))
        out["compiled_fwd_bwd_s"] = timed(lambda: c(x, cos, sin).sum().backward())
    except Exception as e:
        out["compile_error"] = str(e)[:300]
    return out


def main():
    res = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name, fn in (("hbm", hbm), ("attention", attention), ("fp8", fp8), ("layer", layer)):
        try:
            res[name] = fn()
        except Exception as e:
            res[name] = {"error": str(e)[:300]}
        print(name, json.dumps(res[name]), flush=True)
    text = json.dumps(res, indent=1)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
