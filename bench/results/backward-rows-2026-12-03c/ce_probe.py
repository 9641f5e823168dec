"""Cross-entropy at Qwen3's loss shape (2x2048 tokens x 151936 vocab, bf16 logits): forward + backward time
and peak memory above the inputs for eager (transformers' form: logits.float() then F.cross_entropy),
torch.compile of the same, Liger's cross-entropy; a same-size copy for reference."""

import json
import statistics

import torch
import torch.nn.functional as F

torch.manual_seed(0)
N, V = 4096, 151936
logits = (torch.randn(N, V, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
labels = torch.randint(0, V, (N,), device="cuda")


def eager(x, y):
    return F.cross_entropy(x.float(), y, ignore_index=-100)


comp = torch.compile(eager, dynamic=False)
impl = {"eager": eager, "torch.compile": comp}
try:
    from liger_kernel.transformers.functional import liger_cross_entropy

    impl["Liger"] = lambda x, y: liger_cross_entropy(x, y, ignore_index=-100)
except Exception as e:
    print("no liger", e)


def fb(f):
    logits.grad = None
    f(logits, labels).backward()


def fwd(f):
    with torch.no_grad():
        f(logits, labels)


def t(fn, n=10):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


out = {}
src = torch.empty(N * V, dtype=torch.bfloat16, device="cuda")
dst = torch.empty_like(src)
out["copy 1.24 GB ms"] = t(lambda: dst.copy_(src))
for name, f in impl.items():
    r = {"fwd ms": t(lambda: fwd(f)), "fwd+bwd ms": t(lambda: fb(f))}
    logits.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fb(f)
    torch.cuda.synchronize()
    r["peak GiB above inputs"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    out[name] = r
    print(name, r, flush=True)
print(json.dumps(out, indent=1))
