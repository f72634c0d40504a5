"""How many cuBLAS workspaces a PyTorch rank keeps, measured on the GPU.

The memory model prices `library_workspaces` as one cuBLAS workspace per
(handle, stream) that runs GEMMs; autograd runs backward on its own thread, so
a rank whose forward and backward GEMMs go through torch holds two. This
script measures that with torch.cuda.memory_allocated, using matrices small
enough (256 x 256 bf16, 128 KiB) that a 32 MiB workspace stands out.

Run on a CUDA machine: python3 bench/device/cublas_workspaces.py [OUT.json]
"""
import json
import sys

import torch

MiB = 1 << 20


def allocated():
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def main():
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "capability": list(torch.cuda.get_device_capability(0))}
    n = 256
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    tensor = n * n * 2
    base = allocated()
    y = x @ w  # first GEMM on the main thread's handle
    after_fwd = allocated()
    out["forward_extra_mib"] = (after_fwd - base - tensor) / MiB
    y.sum().backward()  # backward GEMMs run on autograd's device thread
    after_bwd = allocated()
    # grads of x and w (2 tensors) and y's grad (freed) -> count x.grad, w.grad
    out["backward_extra_mib"] = (after_bwd - after_fwd - 2 * tensor) / MiB
    # A second forward + backward must add nothing: the workspaces are cached.
    x.grad = None
    w.grad = None
    before = allocated()
    z = x @ w
    z.sum().backward()
    del z
    out["steady_state_extra_mib"] = (allocated() - before - 2 * tensor) / MiB
    # A GEMM on a side stream gets its own workspace (handle, stream) pair.
    s = torch.cuda.Stream()
    before = allocated()
    with torch.cuda.stream(s):
        v = (x @ w).detach()
    torch.cuda.synchronize()
    out["side_stream_extra_mib"] = (allocated() - before - tensor) / MiB
    del v
    out["total_workspace_mib_after_fwd_bwd"] = out["forward_extra_mib"] + out["backward_extra_mib"]
    text = json.dumps(out, indent=2)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
