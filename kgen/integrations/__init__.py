"""kgen's kernels in real models: transformers (through `kernels.kernelize`) and diffusers (LTX-Video)."""
