"""Saved activations of a Llama 3 block under torchtitan's checkpoint policies,
and the fp32-upcast loss's bytes per logit, measured on the GPU.

A torchtitan-style Llama 3 8B block (nn.RMSNorm, complex RoPE in fp32,
repeat_kv, flash SDPA, SwiGLU, bf16 weights) runs with no checkpoint, with a
plain non-reentrant checkpoint per block (full), and with torchtitan's per-op
selective policy (SelectiveAC op mode: save aten.mm outputs except every second
mm of the block, and the SDPA outputs). The bytes a block keeps are the
difference of torch.cuda.memory_allocated after the forward of 8 and of 4
blocks, divided by 4 blocks and by the tokens. The loss part runs
torch.nn.functional.cross_entropy(logits.float(), labels) on bf16 logits as
torchtitan's train step does (the logits deleted before backward) and reports
bytes per logit at each point.

Run on a CUDA machine: python3 bench/device/sac_activations.py [OUT.json]
With `--gqa OUT.json` it measures only the no-checkpoint block with SDPA's
enable_gqa (current torchtitan) in place of repeat_kv, under the flash and the
cuDNN backends.
"""
import collections
import functools
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

H, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336
BATCH, SEQ = 1, 8192
VOCAB = 128256
GQA_BACKEND = None  # set by --gqa: SDPA's enable_gqa under this backend


def rope_table(seq, dim, theta=500000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device="cuda")[: dim // 2].float() / dim))
    t = torch.arange(seq, device="cuda", dtype=torch.float32)
    return torch.polar(torch.ones(seq, dim // 2, device="cuda"), torch.outer(t, freqs))


def apply_rope(xq, xk, freqs):
    # torchtitan's apply_rotary_emb: fp32 complex product, cast back.
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * f).flatten(3).type_as(xq), torch.view_as_real(xk_ * f).flatten(3).type_as(xk)


def repeat_kv(x, n):
    b, s, kv, d = x.shape
    return x[:, :, :, None, :].expand(b, s, kv, n, d).reshape(b, s, kv * n, d)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(H, eps=1e-5)
        self.ffn_norm = nn.RMSNorm(H, eps=1e-5)
        self.wq = nn.Linear(H, HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(H, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(H, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, H, bias=False)
        self.w1 = nn.Linear(H, FFN, bias=False)
        self.w2 = nn.Linear(FFN, H, bias=False)
        self.w3 = nn.Linear(H, FFN, bias=False)

    def attention(self, x, freqs):
        b, s, _ = x.shape
        xq = self.wq(x).view(b, s, HEADS, HEAD_DIM)
        xk = self.wk(x).view(b, s, KV_HEADS, HEAD_DIM)
        xv = self.wv(x).view(b, s, KV_HEADS, HEAD_DIM)
        xq, xk = apply_rope(xq, xk, freqs)
        if GQA_BACKEND is None:  # torchtitan 9dec370: K and V expanded to every query head
            keys, values = repeat_kv(xk, HEADS // KV_HEADS), repeat_kv(xv, HEADS // KV_HEADS)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2),
                                                     values.transpose(1, 2), is_causal=True)
        else:  # torchtitan b5bcd76: the kernel reads the kv_heads itself
            with sdpa_kernel(GQA_BACKEND):
                out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                                     is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).contiguous().view(b, s, -1))

    def forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        g = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(g)) * self.w3(g))


SAVE = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten.max.default,
}


def op_policy(meta):
    # torchtitan's _get_custom_policy: count mm per forward / recompute, save
    # the odd ones (1st, 3rd, ...) and the SDPA outputs.
    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        save = func in SAVE and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def op_context():
    return create_selective_checkpoint_contexts(op_policy(collections.defaultdict(int)))


def run_blocks(blocks, x, freqs, mode):
    for b in blocks:
        if mode == "none":
            x = b(x, freqs)
        elif mode == "full":
            x = checkpoint(b, x, freqs, use_reentrant=False, preserve_rng_state=False)
        else:
            x = checkpoint(b, x, freqs, use_reentrant=False, preserve_rng_state=False, context_fn=op_context)
    return x


def allocated():
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def measure(layers, mode, freqs):
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(layers)).to(device="cuda", dtype=torch.bfloat16)
    for p in blocks.parameters():
        nn.init.normal_(p, std=0.02) if p.dim() > 1 else nn.init.ones_(p)
    x = torch.randn(BATCH, SEQ, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(BATCH, SEQ, H, device="cuda", dtype=torch.bfloat16)
    base = allocated()
    torch.cuda.reset_peak_memory_stats()
    out = run_blocks(blocks, x, freqs, mode)
    after = allocated()
    fwd_peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out.backward(grad)
    bwd_peak = torch.cuda.max_memory_allocated()
    param_bytes = sum(p.numel() * p.element_size() for p in blocks.parameters())
    result = {"saved": after - base, "forward_peak_over_base": fwd_peak - base,
              "backward_peak_over_after_forward": bwd_peak - after, "param_bytes": param_bytes}
    del blocks, x, grad, out
    torch.cuda.empty_cache()
    return result


def loss_bytes():
    tokens = BATCH * SEQ
    torch.manual_seed(0)
    hid = torch.randn(tokens, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(VOCAB, H, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    labels = torch.randint(0, VOCAB, (tokens,), device="cuda")
    base = allocated()
    logits = hid @ w.t()
    with_logits = allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = F.cross_entropy(logits.float(), labels)
    fwd_peak = torch.cuda.max_memory_allocated()
    after_loss = allocated()
    del logits
    after_del = allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    bwd_peak = torch.cuda.max_memory_allocated()
    n = tokens * VOCAB
    return {"logits": n, "logits_bytes_per_logit": (with_logits - base) / n,
            "forward_peak_per_logit": (fwd_peak - base) / n,
            "saved_with_logits_per_logit": (after_loss - base) / n,
            "saved_after_del_per_logit": (after_del - base) / n,
            "backward_peak_over_saved_per_logit": (bwd_peak - after_del) / n,
            "weight_grad_bytes": VOCAB * H * 2}


def saved_inventory(freqs):
    """Every tensor one block's autograd graph saves under no checkpoint,
    storages counted once: (node, attribute, dtype, shape, storage bytes)."""
    torch.manual_seed(0)
    block = Block().to(device="cuda", dtype=torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    x = torch.randn(BATCH, SEQ, H, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = block(x, freqs)
    seen, rows, stack, visited = set(), [], [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except Exception:  # noqa: BLE001 - some saved fields are not readable
                continue
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
                    continue
                ptr = t.untyped_storage().data_ptr()
                if ptr in params:
                    continue
                new = ptr not in seen
                seen.add(ptr)
                rows.append({"node": node.name(), "attr": attr, "dtype": str(t.dtype), "shape": list(t.shape),
                             "storage_bytes": t.untyped_storage().nbytes() if new else 0})
        stack.extend(n for n, _ in node.next_functions)
    total = sum(r["storage_bytes"] for r in rows)
    return {"tensors": rows, "bytes": total, "bytes_per_token": total / (BATCH * SEQ)}


def gqa_main(path):
    global GQA_BACKEND
    freqs, out = rope_table(SEQ, HEAD_DIM), {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        GQA_BACKEND = backend
        four, eight = measure(4, "none", freqs), measure(8, "none", freqs)
        out[name] = (eight["saved"] - four["saved"]) / 4 / (BATCH * SEQ)
        print(name, out[name], "B/token/block", flush=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--gqa":
        gqa_main(sys.argv[2])
        return
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
           "block": {"hidden": H, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "ffn": FFN,
                     "batch": BATCH, "seq": SEQ, "dtype": "bfloat16", "sdpa": "flash"},
           "policies": {}}
    freqs = rope_table(SEQ, HEAD_DIM)
    tokens = BATCH * SEQ
    for mode in ("none", "full", "op"):
        four, eight = measure(4, mode, freqs), measure(8, mode, freqs)
        per_block = (eight["saved"] - four["saved"]) / 4
        out["policies"][mode] = {"layers4": four, "layers8": eight, "saved_per_block": per_block,
                                 "saved_per_block_per_token": per_block / tokens}
        print(mode, per_block / tokens, "B/token/block", flush=True)
    out["loss"] = loss_bytes()
    out["inventory_none"] = saved_inventory(freqs)
    print(json.dumps(out, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
