"""How a feature map's rows are split over the ranks of a spatial process group.

Every map, the input image and each stage's output alike, is split on its own height
``H``: rank ``r`` of ``P`` owns rows ``[floor(r H / P), floor((r + 1) H / P))``. The
bands differ by at most one row. A layer that
maps rows to rows (a strided convolution, an upsampling) fetches the input rows its
output band needs from the neighbours (halo exchange); nothing ties the bands of two
stages together, so the split of a stage is a function of its own height and P only
(and so, through the stage strides, of the image height).

This file depends on torch only.
"""

from typing import List, Sequence, Tuple

__all__ = ['band_bounds', 'band_of', 'check_world_size']


def band_bounds(size: int, world_size: int) -> List[Tuple[int, int]]:
    """``[(start, stop)]`` of every rank's rows of a map ``size`` rows high."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f'size must be a positive int, got {size!r}')
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f'world_size must be a positive int, got {world_size!r}')
    return [((r * size) // world_size, ((r + 1) * size) // world_size) for r in range(world_size)]


def band_of(size: int, rank: int, world_size: int) -> Tuple[int, int]:
    """``(start, stop)`` of ``rank``'s rows of a map ``size`` rows high."""
    if not 0 <= rank < world_size:
        raise ValueError(f'rank must be in [0, {world_size - 1}], got {rank!r}')
    return band_bounds(size, world_size)[rank]


def check_world_size(heights: Sequence[int], world_size: int, what: str = 'image') -> None:
    """Every rank must own at least one row of every map: ``world_size`` <= the smallest
    height. ``heights``: the rows of each map (e.g. every stage's); ``what``: how the
    message names the input."""
    smallest = min(heights)
    if world_size > smallest:
        raise ValueError(
            f'world_size={world_size} is larger than the {smallest} rows of the smallest '
            f'feature map of this {what} (heights {tuple(heights)}): the largest usable '
            f'number of processes is {smallest}'
        )
