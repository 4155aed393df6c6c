"""How a feature map's rows are split over the ranks of a spatial process group.

Every map, the input image and each stage's output alike, is split on its own height
``H`` as ``torch.chunk`` and DTensor's ``Shard`` placement split a dimension: bands of
``c = ceil(H / P)`` rows, the larger bands first, rank ``r`` owning rows
``[min(r c, H), min((r + 1) c, H))`` (the last bands may be shorter or empty; every
sharded path requires each rank to own at least one row, :func:`check_world_size`).
A layer that maps rows to rows (a strided convolution, an upsampling) fetches the input
rows its output band needs from the neighbours (halo exchange); nothing ties the bands
of two stages together, so the split of a stage is a function of its own height and P
only (and so, through the stage strides, of the image height).
"""

from typing import List, Sequence, Tuple

from mmcirc.ops.core import check_positive

__all__ = ['band_bounds', 'check_world_size']


def band_bounds(size: int, world_size: int) -> List[Tuple[int, int]]:
    """``[(start, stop)]`` of every rank's rows of a map ``size`` rows high (the split
    above; ``(size, size)`` for the ranks past the last chunk)."""
    check_positive('size', size)
    check_positive('world_size', world_size)
    c = -(-size // world_size)  # torch.chunk's chunk size
    return [(min(r * c, size), min((r + 1) * c, size)) for r in range(world_size)]


def check_world_size(heights: Sequence[int], world_size: int, what: str = 'image') -> None:
    """Every rank must own at least one row of every map (of :func:`band_bounds`).
    ``heights``: the rows of each map (e.g. every stage's); ``what``: how the message
    names the input."""
    smallest = min(heights)
    if world_size > smallest:
        raise ValueError(
            f'world_size={world_size} is larger than the {smallest} rows of the smallest '
            f'feature map of this {what} (heights {tuple(heights)}): the largest usable '
            f'number of processes is {smallest}'
        )
    for h in heights:
        if not _all_own_rows([h], world_size):
            fewer = max(p for p in range(1, world_size) if _all_own_rows(heights, p))
            raise ValueError(
                f'world_size={world_size} leaves the last rank no rows of the {h}-row feature '
                f'map of this {what} (bands of ceil({h}/{world_size}) rows, heights '
                f'{tuple(heights)}): the largest usable number of processes below '
                f'{world_size} is {fewer}'
            )


def _all_own_rows(heights: Sequence[int], world_size: int) -> bool:
    return all(band_bounds(int(h), world_size)[-1][0] < int(h) for h in heights)
