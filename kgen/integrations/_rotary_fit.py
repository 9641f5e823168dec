"""The head sizes kgen's q/k norm + rotation kernels (qk_norm_rope, qk_norm_rope_flux, qk_norm_rope_wan)
serve, for the integrations that choose per call between one of them and the model's own code. The lanes
that share a head sum it with warp shuffles: D / (the elements a lane keeps) must be a power of two up to
32. A lane keeps one 16-byte access (every arch profile's max_access_bytes), one of each half of the head
for rotate_half pairs (the generated launcher refuses any other size)."""

ACCESS_BYTES = 16


def lanes_fit(head_dim: int, element_size: int, half_pairs: bool) -> bool:
    per_lane = ACCESS_BYTES // element_size * (2 if half_pairs else 1)
    lanes = head_dim // per_lane
    return head_dim % per_lane == 0 and 1 <= lanes <= 32 and lanes & (lanes - 1) == 0
