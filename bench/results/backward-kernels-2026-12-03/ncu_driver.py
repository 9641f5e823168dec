"""One kgen backward call between cudaProfilerStart/Stop, for ncu --profile-from-start off.

python3 ncu_driver.py BUILD_ROOT OP ROWSxHIDDEN"""

import sys

import torch

from kgen.autodiff import gradient_outputs
from kgen.bench import example_inputs
from kgen.builder import build_op, device_arch, load
from kgen.catalog import backward_spec, load_spec

root, op, shape = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3].split("x")]
spec = load_spec(op)
kernel = getattr(load(build_op(op, device_arch(), root)), op)
gradients = gradient_outputs(spec, backward_spec(op))
inputs = [
    t.requires_grad_(s.name in gradients)
    for t, s in zip(example_inputs(spec, shape, torch.bfloat16), spec.inputs)
]
outs = kernel(*inputs)
outs = outs if isinstance(outs, tuple) else (outs,)
leaves = [t for t in inputs if t.requires_grad]
grads = [torch.randn_like(o) for o in outs]
torch.autograd.grad(outs, leaves, grads, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(outs, leaves, grads, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
