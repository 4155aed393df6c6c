"""mmcirc.distributed.fft on 2 and 3 gloo ranks against torch.fft on the whole map (float64).

One run_parallel call per world size computes every case; the tests compare the
assembled bands with torch.fft in this process."""

import pytest
import torch

from mmcirc.ops.circulant import fft_grid
from mmcirc.distributed import band_bounds, run_parallel
from mmcirc.distributed.comm import count_bytes, group_rank_size
from mmcirc.distributed.fft import (
    sharded_irfft2,
    sharded_rfft2,
    spectrum_columns,
    transpose_bytes,
)


# name: (leading dims, rows, W, FFT grid); rows 7 and 10 do not divide by 3 (nor 7 by 2)
CASES = {
    'even': ((2, 3), 6, 8, (6, 8)),
    'odd_rows': ((2, 3), 7, 5, (7, 5)),
    'zero_grid': ((2, 3), 7, 5, fft_grid(7, 5, 'zero')),  # (15, 9): padding rows
    'zero_grid_h10': ((1, 2), 10, 6, fft_grid(10, 6, 'zero')),  # (20, 12)
    'few_columns': ((3,), 7, 2, (7, 2)),  # U = 2 < P = 3: a rank without columns
}
TOL = dict(rtol=1e-10, atol=1e-10)


def _inputs(name):
    """Whole real map (lead, rows, W) and whole half spectrum (lead, Ph, U)."""
    lead, rows, w, grid = CASES[name]
    g = torch.Generator().manual_seed(sorted(CASES).index(name))
    x = torch.randn(*lead, rows, w, generator=g, dtype=torch.float64)
    z = torch.randn(*lead, grid[0], grid[1] // 2 + 1, 2, generator=g, dtype=torch.float64)
    return x, torch.view_as_complex(z)


def _worker():
    rank, size = group_rank_size()
    out = {}
    for name, (lead, rows, w, grid) in CASES.items():
        x, z = _inputs(name)
        r0, r1 = band_bounds(rows, size)[rank]
        c0, c1 = spectrum_columns(grid, size)[rank]
        with count_bytes() as sent:
            fx = sharded_rfft2(x[..., r0:r1, :], rows, grid)  # (lead, Ph, u_r)
            iz = sharded_irfft2(z[..., c0:c1], rows, grid, w)  # (lead, h_r, W)
        back = sharded_irfft2(fx, rows, grid, w)  # (lead, h_r, W)
        out[name] = dict(fx=fx, iz=iz, back=back, sent=sent['all_to_all'])
    return out


@pytest.fixture(scope='module', params=[2, 3], ids=['P2', 'P3'])
def ranks(request):
    """(P, [per-rank results]) of one run_parallel call."""
    return request.param, run_parallel(_worker, request.param)


@pytest.mark.parametrize('name', list(CASES))
def test_rfft2_equals_fft2(ranks, name):
    """Column bands of the sharded forward, concatenated, equal torch.fft.fft2's half."""
    _, results = ranks
    x, _ = _inputs(name)
    grid = CASES[name][3]
    got = torch.cat([r[name]['fx'] for r in results], dim=-1)
    want = torch.fft.fft2(x, s=grid)[..., : grid[1] // 2 + 1]
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize('name', list(CASES))
def test_irfft2_equals_irfft2(ranks, name):
    """Row bands of the sharded inverse, concatenated, equal torch.fft.irfft2 cropped."""
    _, results = ranks
    _, z = _inputs(name)
    _, rows, w, grid = CASES[name]
    got = torch.cat([r[name]['iz'] for r in results], dim=-2)
    want = torch.fft.irfft2(z, s=grid)[..., :rows, :w]
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize('name', list(CASES))
def test_round_trip(ranks, name):
    """Inverse of the forward gives the map back (the padding cropped)."""
    _, results = ranks
    x, _ = _inputs(name)
    got = torch.cat([r[name]['back'] for r in results], dim=-2)
    torch.testing.assert_close(got, x, **TOL)


@pytest.mark.parametrize('name', list(CASES))
def test_transpose_bytes(ranks, name):
    """transpose_bytes is what the ranks hand to all_to_all_single (forward + inverse)."""
    size, results = ranks
    lead, rows, _, grid = CASES[name]
    numel = torch.Size(lead).numel()
    want = 2 * transpose_bytes(numel, rows, grid, size, 8)
    assert sum(r[name]['sent'] for r in results) == want
    assert want > 0
