"""Attention-matrix memory of the stages that materialise one, at a given image size.

Quadratic attention (PVT's spatial reduction, ``'sra'``) stores a score matrix whose
size grows with the square of the image area, windowed attention (``'window'``) one
linear in it; circulant (O(N log N)) and core (O(N C')) attention store none. Each
block says what it materialises (``attention_matrix``); :func:`quadratic_warning` says
in one line when that would not fit in the memory this process can still use
(:func:`memory_budget`), before anything runs.
"""

import contextlib
import resource
from typing import List, Optional, Tuple

from mmcirc.models.backbones.pyramid import PyramidBackbone
from mmcirc.utils.memory import address_space_bytes

__all__ = ['memory_budget', 'quadratic_attention_estimates', 'quadratic_warning']

GB = 1024**3


def quadratic_attention_estimates(backbone, hw: Tuple[int, int]) -> List[dict]:
    """Attention-matrix memory of each stage whose blocks materialise one, at image size ``hw``.

    Each block says what it materialises (``attention_matrix``): ``'sra'`` (mmdet's PVT
    layer, ``nn.MultiheadAttention`` with ``need_weights``): queries = tokens N, keys =
    (h // sr) * (w // sr), quadratic in the image area; ``'window'`` (Swin): keys =
    window**2 per query (linear). The scores and their softmax, float32, per head:
    ``bytes ~= 2 * 4 * heads * queries * keys``. One dict per such stage: stage
    (1-based), attention, grid, queries, keys, heads, bytes. Backbones without
    pyramid stages (CA-DeiT: O(N log N), VECA: O(N C')) have none.
    """
    if not isinstance(backbone, PyramidBackbone):
        return []
    stages = list(backbone.stages)
    firsts = [s.blocks[0] if len(s.blocks) else None for s in stages]
    if not any(getattr(b, 'attention_matrix', None) for b in firsts):
        return []
    out = []
    for i, (stage, block, grid) in enumerate(zip(stages, firsts, backbone.stage_grids(hw))):
        m = block.attention_matrix(grid) if hasattr(block, 'attention_matrix') else None
        if m is not None:
            q, k, heads = m['queries'], m['keys'], m['heads']
            out.append(dict(stage=i + 1, attention=stage.attention, grid=list(grid), queries=q,
                            keys=k, heads=heads, bytes=2 * 4 * heads * q * k))  # fmt: skip
    return out


def memory_budget() -> Tuple[int, str]:
    """Bytes this process can still use: MemAvailable, or the RLIMIT_AS headroom when
    smaller. Returns (bytes, description)."""
    avail, what = None, 'unknown'
    with contextlib.suppress(OSError), open('/proc/meminfo') as f:
        for line in f:
            if line.startswith('MemAvailable:'):
                avail, what = int(line.split()[1]) * 1024, 'available RAM'
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        left = soft - address_space_bytes()
        if avail is None or left < avail:
            avail, what = left, 'RLIMIT_AS headroom'
    return (avail if avail is not None else 1 << 62), what


def quadratic_warning(backbone, hw: Tuple[int, int]) -> Optional[str]:
    """One-line warning when a quadratic (``'sra'``) or windowed stage's attention
    would not fit in :func:`memory_budget` at size ``hw``; None otherwise."""
    budget, what = memory_budget()
    bad = [e for e in quadratic_attention_estimates(backbone, hw) if e['bytes'] > budget]
    if not bad:
        return None
    parts = ', '.join(
        f"stage {e['stage']} ('{e['attention']}': {e['queries']} queries x {e['keys']} "
        f'keys x {e["heads"]} heads ~ {e["bytes"] / GB:.1f} GB)'
        for e in bad
    )
    quadratic = {b.kind for b in backbone.block_types if b.quadratic}
    quad = all(e['attention'] in quadratic for e in bad)
    return (
        f'WARNING: at {hw[0]}x{hw[1]} the {"quadratic " if quad else ""}attention of {parts} exceeds '
        f"the {budget / GB:.1f} GB of {what}; expect an out-of-memory failure. 'sra' stages are "
        f'quadratic in the image area: use an all-circulant or all-core pyramid (stage_attentions='
        f"'circulant' or 'core', e.g. configs/ca_pvt_t-allcirc_fpn_80k_ade20k.py)"
    )
