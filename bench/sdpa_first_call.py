"""The first call of scaled_dot_product_attention at each new key length, with and without cuDNN's
backend, against the calls after it: decode-shaped attention (32 sequences, 32 query heads over 8
key/value heads, one query, a boolean length mask), bf16 on the GPU. cuDNN builds an execution plan
per shape on its first call; what that costs is what a recorded decode step pays for each new shape.

  python3 bench/sdpa_first_call.py
"""

import time

import torch
import torch.nn.functional as F


def run(cudnn):
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    out = []
    for keys in [16, 32, 64, 128, 256, 512]:
        q = torch.randn(32, 32, 1, 64, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(32, 8, keys, 64, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        mask = torch.ones(32, 1, 1, keys, dtype=torch.bool, device="cuda")
        torch.cuda.synchronize()
        t = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(10):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        torch.cuda.synchronize()
        out.append(f"S={keys}: first {first * 1e3:.1f} ms, then {(time.perf_counter() - t) * 1e2:.3f} ms a call")
    print("cudnn" if cudnn else "no cudnn", "; ".join(out))


if __name__ == "__main__":
    torch.zeros(1, device="cuda")  # the context first, outside the timings
    run(False)
    run(True)
