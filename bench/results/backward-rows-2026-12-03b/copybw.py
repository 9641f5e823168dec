"""Device-to-device copy_ at several sizes (bytes read + written), CUDA events, L2 flushed, median of 20."""

import json

import torch

flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
for mb in (8, 32, 64, 100, 134, 201, 302, 1024):
    n = mb * 2**20 // 2 // 2
    a = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    ts = []
    for _ in range(23):
        flush.zero_()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    ts = sorted(ts[3:])
    t = ts[len(ts) // 2]
    print(
        json.dumps(
            {
                "traffic_MB": round(2 * a.numel() * 2 / 1e6, 1),
                "us": round(t, 2),
                "GBps": round(2 * a.numel() * 2 / t / 1e3),
            }
        )
    )
