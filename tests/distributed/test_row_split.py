"""mmcirc.distributed.row_split: the band rule is torch.chunk's, the split DTensor's Shard(2)
placement assumes (its full_tensor() rebuilds the map from our bands on 2 and 3 gloo
ranks at heights that do not divide); world sizes that leave a rank without rows are
refused in one line."""

import pytest
import torch

from mmcirc.distributed import band_bounds, check_world_size, run_parallel
from mmcirc.distributed.comm import group_rank_size

SIZES = [(7, 5), (10, 3), (4, 6)]  # H x W; 4 rows on 3 ranks: (2, 2, 0)


def test_band_bounds_follow_torch_chunk():
    """The split of torch.chunk (and DTensor's Shard): ceil(H / P) rows, larger first."""
    for h, p in [(70, 3), (7, 3), (10, 4), (5, 5), (1, 1), (4, 3), (2, 4)]:
        chunks = torch.arange(h).chunk(p)
        want = [(int(c[0]), int(c[-1]) + 1) for c in chunks] + [(h, h)] * (p - len(chunks))
        assert band_bounds(h, p) == want, (h, p)


def test_world_size_leaving_a_rank_without_rows_is_refused():
    check_world_size([7, 5], 3)  # bands (3, 3, 1) and (2, 2, 1)
    with pytest.raises(
        ValueError, match=r'world_size=3 leaves the last rank no rows of the 4-row .* below 3 is 2'
    ) as err:
        check_world_size([9, 4], 3)  # 4 rows -> bands (2, 2, 0)
    assert len(str(err.value).splitlines()) == 1


def _dtensor_rebuilds():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    rank, size = group_rank_size()
    mesh = init_device_mesh('cpu', (size,))
    out = []
    for h, w in SIZES:
        full = torch.arange(2 * h * w, dtype=torch.float64).view(1, 2, h, w)
        a, b = band_bounds(h, size)[rank]
        band = DTensor.from_local(
            full[:, :, a:b], mesh, [Shard(2)], shape=full.shape, stride=full.stride()
        )
        out.append(torch.equal(band.full_tensor(), full))
    return out


@pytest.mark.parametrize('nprocs', [2, 3])
def test_dtensor_shard_placement_rebuilds_the_map_from_our_bands(nprocs):
    torch.set_num_threads(1)
    assert run_parallel(_dtensor_rebuilds, nprocs) == [[True] * len(SIZES)] * nprocs
