"""`kgen bench --e2e qwen3`'s kgen variants with kgen's unfused RMSNorm (the decoder layers' own forward: each
residual add a separate kernel), for a before/after in the same lease. Usage: before.py OUT BUILD_ROOT."""

import sys
from pathlib import Path

from kgen.integrations import e2e, transformers, workloads

UNFUSED = ("rmsnorm", "silu_mul")
workloads.kernelize = lambda model, ops=UNFUSED, **kwargs: transformers.kernelize(model, UNFUSED, **kwargs)
result = e2e.run_e2e(
    "qwen3", build_root=Path(sys.argv[2]), variants=("eager + kgen", "torch.compile + kgen"), log=print
)
print(e2e.write(result, Path(sys.argv[1])).read_text())
