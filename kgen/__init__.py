"""kgen: fused CUDA kernels and their PyTorch bindings, generated from small op specs.

The pipeline, one way: spec (ops/, kgen.dsl) -> plan (kgen.planner, reading arch/ through
kgen.profile) -> render (kgen.codegen + codegen_templates/, kgen.render) -> package
(a kernel-builder project) -> build & load (kgen.builder, loaded through `kernels`)."""

__version__ = "0.1.0"
