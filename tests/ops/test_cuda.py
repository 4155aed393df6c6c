"""The attention operators on CUDA (cuFFT, CUDA softmax/SDPA, autocast) against the
float64 dense references computed on the CPU.

CI has no GPU, so these tests are skipped there (the skip names the reason); they
run wherever torch sees a CUDA device, e.g. ``python -m pytest tests/ops/test_cuda.py``
on the lent GPU machine (torch alone is enough: ``mmcirc.ops`` needs no OpenMMLab).
"""

import pytest
import torch

from dense_reference import circulant_module_dense, core_attention_dense
from mmcirc.ops import CirculantAttention, CoreAttention, select_cores

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
CUDA = 'cuda'
# non-square, odd and prime sides (cuFFT plans for non-power-of-two sizes)
SIZES = [(8, 8), (7, 11), (13, 1), (37, 53)]


def _circulant(boundary, dim=8, seed=0):
    torch.manual_seed(seed)
    return CirculantAttention(dim, boundary=boundary, scale='n')


def _core(dim=16, num_heads=2, seed=0, **kwargs):
    torch.manual_seed(seed)
    m = CoreAttention(dim, num_heads, **kwargs)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(std=0.2)
    return m


@pytest.mark.parametrize('boundary', ['circular', 'zero'])
@pytest.mark.parametrize('hw', SIZES)
def test_circulant_cuda_float32_matches_dense(boundary, hw):
    m = _circulant(boundary)
    x = torch.randn(2, hw[0] * hw[1], 8)
    ref = circulant_module_dense(m.double(), x.double(), hw)  # CPU, float64
    y = m.float().to(CUDA)(x.to(CUDA), hw)
    assert y.device.type == CUDA and y.dtype == torch.float32
    torch.testing.assert_close(y.cpu().double(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('boundary', ['circular', 'zero'])
def test_circulant_cuda_gradients_match_cpu_float64(boundary):
    hw = (7, 11)
    m64 = _circulant(boundary).double()
    m32 = _circulant(boundary).to(CUDA)
    x = torch.randn(1, 77, 8, dtype=torch.float64)
    x64 = x.clone().requires_grad_()
    x32 = x.float().to(CUDA).requires_grad_()
    m64(x64, hw).square().sum().backward()
    m32(x32, hw).square().sum().backward()
    torch.testing.assert_close(x32.grad.cpu().double(), x64.grad, rtol=1e-3, atol=1e-5)
    for (name, p64), p32 in zip(m64.named_parameters(), m32.parameters()):
        torch.testing.assert_close(
            p32.grad.cpu().double(), p64.grad, rtol=1e-3, atol=1e-5, msg=name
        )


@pytest.mark.parametrize('boundary', ['circular', 'zero'])
def test_circulant_cuda_autocast_bf16_is_finite_and_close(boundary):
    """Under CUDA autocast the FFTs run in float32 (cuFFT has no bfloat16 and takes
    half precision only at powers of two): a 97 x 131 map must work and stay close."""
    hw = (97, 131)
    m = _circulant(boundary, dim=16).to(CUDA)
    x = torch.randn(1, hw[0] * hw[1], 16, device=CUDA) * 4
    with torch.autocast(CUDA, dtype=torch.bfloat16):
        y = m(x, hw)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    ref = m(x, hw)
    err = (y.float() - ref).norm() / ref.norm()
    assert err < 0.03, f'relative error {err:.4f} under bf16 autocast'


@pytest.mark.parametrize('chunk_size', [None, 7])
def test_core_cuda_float32_matches_dense(chunk_size):
    m = _core(chunk_size=chunk_size)
    x = torch.randn(2, 61, 16, dtype=torch.float64)
    bank = torch.randn(32, 16, dtype=torch.float64)
    cores = select_cores(bank, 8, 2)
    y_ref, c_ref = core_attention_dense(m.double(), x, cores)  # CPU, float64
    y, c = m.float().to(CUDA)(x.float().to(CUDA), cores.float().to(CUDA))
    assert y.device.type == c.device.type == CUDA
    torch.testing.assert_close(y.cpu().double(), y_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c.cpu().double(), c_ref, rtol=1e-4, atol=1e-5)


def test_core_cuda_autocast_bf16_is_finite_and_close():
    m = _core().to(CUDA)
    x = torch.randn(1, 4096, 16, device=CUDA) * 4
    cores = select_cores(torch.randn(64, 16, device=CUDA) * 0.02, 64, 1)
    with torch.autocast(CUDA, dtype=torch.bfloat16):
        y, c = m(x, cores)
    assert torch.isfinite(y).all() and torch.isfinite(c).all()
    y_ref, _ = m(x, cores)
    err = (y.float() - y_ref).norm() / y_ref.norm()
    assert err < 0.03, f'relative error {err:.4f} under bf16 autocast'
