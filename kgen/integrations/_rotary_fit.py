"""The head sizes kgen's q/k norm + rotation kernels (qk_norm_rope, qk_norm_rope_flux, qk_norm_rope_wan,
qk_norm_rope3d) serve, for the integrations that choose per call between one of them and the model's own
code. D / (the elements a lane keeps) lanes sum a head: a power of two, up to 32 with warp shuffles, and for
a norm over each head also up to a block's threads (whole warps: LTX-Video's C = 2048 as one head). A lane
keeps one 16-byte access (every arch profile's max_access_bytes), one of each half of the head for
rotate_half pairs; a block has 256 threads (every arch profile's planner.block_threads: the rotary family's
constants, tests/test_profiles.py). The generated launcher refuses any other size."""

from ..families.rotary import ACCESS_BYTES, BLOCK_THREADS  # noqa: F401 (this module's names too)


def lanes_fit(head_dim: int, element_size: int, half_pairs: bool, over: str = "head") -> bool:
    """Whether a norm over each head (or over a token's heads: ``over="token"``) of that size is served."""
    per_lane = ACCESS_BYTES // element_size * (2 if half_pairs else 1)
    lanes = head_dim // per_lane
    most = BLOCK_THREADS if over == "head" else 32
    return head_dim % per_lane == 0 and 1 <= lanes <= most and lanes & (lanes - 1) == 0
