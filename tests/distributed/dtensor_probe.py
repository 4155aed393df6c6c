"""What torch's DTensor carries of the ops a sharded segmentor needs: a (1, 4, 7, 5)
float64 map as ``DTensor.from_local(band, mesh, [Shard(2)])`` on 2 and 3 gloo ranks
(bands: :func:`mmcirc.distributed.band_bounds`), each op against the same op on the whole
map; prints rank 0's line per op (result placement and max error, or the error).
Not a test: the record behind docs/sharded.md (why not DTensor).

    PYTHONPATH=. python tests/distributed/dtensor_probe.py
"""

import torch
import torch.nn.functional as F

from mmcirc.distributed import band_bounds, run_parallel
from mmcirc.distributed.comm import group_rank_size


def probe():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    rank, size = group_rank_size()
    mesh = init_device_mesh('cpu', (size,))
    torch.manual_seed(0)
    full = torch.randn(1, 4, 7, 5, dtype=torch.float64)
    a, b = band_bounds(7, size)[rank]
    x = DTensor.from_local(
        full[:, :, a:b], mesh, [Shard(2)], shape=full.shape, stride=full.stride()
    )
    w = torch.randn(4, 1, 3, 3, dtype=torch.float64)
    wd = distribute_tensor(w, mesh, [Replicate()])
    lin = torch.randn(6, 4, dtype=torch.float64)
    lind = distribute_tensor(lin, mesh, [Replicate()])
    cases = {
        'add/gelu': (lambda: F.gelu(x + 1), lambda: F.gelu(full + 1)),
        'conv2d 3x3 dw, plain weight': (
            lambda: F.conv2d(x, w, padding=1, groups=4),
            lambda: F.conv2d(full, w, padding=1, groups=4),
        ),
        'conv2d 3x3 dw, replicated weight': (
            lambda: F.conv2d(x, wd, padding=1, groups=4),
            lambda: F.conv2d(full, w, padding=1, groups=4),
        ),
        'conv2d 3x3 s2, replicated weight': (
            lambda: F.conv2d(x, wd, stride=2, padding=1, groups=4),
            lambda: F.conv2d(full, w, stride=2, padding=1, groups=4),
        ),
        'flatten(2)': (lambda: x.flatten(2), lambda: full.flatten(2)),
        'permute(0,2,3,1) + linear': (
            lambda: F.linear(x.permute(0, 2, 3, 1), lind),
            lambda: F.linear(full.permute(0, 2, 3, 1), lin),
        ),
        'layer_norm over C (channels last)': (
            lambda: F.layer_norm(x.permute(0, 2, 3, 1), (4,)),
            lambda: F.layer_norm(full.permute(0, 2, 3, 1), (4,)),
        ),
        'interpolate bilinear x2': (
            lambda: F.interpolate(x, scale_factor=2, mode='bilinear'),
            lambda: F.interpolate(full, scale_factor=2, mode='bilinear'),
        ),
        'interpolate nearest size': (
            lambda: F.interpolate(x, size=(11, 9)),
            lambda: F.interpolate(full, size=(11, 9)),
        ),
        'adaptive_avg_pool2d 3': (
            lambda: F.adaptive_avg_pool2d(x, 3),
            lambda: F.adaptive_avg_pool2d(full, 3),
        ),
        'group_norm 2': (lambda: F.group_norm(x, 2), lambda: F.group_norm(full, 2)),
        'cat dim 1': (lambda: torch.cat([x, x], 1), lambda: torch.cat([full, full], 1)),
        'softmax over rows': (lambda: x.softmax(2), lambda: full.softmax(2)),
        'rfft2': (lambda: torch.fft.rfft2(x), lambda: torch.fft.rfft2(full)),
    }
    out = {}
    for name, (fn, ref) in cases.items():
        try:
            y = fn()
            yf = y.full_tensor() if isinstance(y, DTensor) else y
            place = tuple(y.placements) if isinstance(y, DTensor) else type(y).__name__
            err = (
                (yf - ref()).abs().max().item()
                if yf.shape == ref().shape
                else f'shape {tuple(yf.shape)}'
            )
            out[name] = f'ok, placements {place}, max err {err}'
        except Exception as e:
            out[name] = f'{type(e).__name__}: {str(e).splitlines()[0][:160]}'
    return out


if __name__ == '__main__':
    torch.set_num_threads(1)
    for p in (2, 3):
        print('P =', p)
        for k, v in run_parallel(probe, p)[0].items():
            print(f'  {k}: {v}')
