"""Check that mmcv's CUDA kernels that mmdet calls on a GPU run and agree with the CPU.

``tools/misc/check_mmcv_cuda.py``: ``nms`` (validation and test of every detector),
``roi_align`` (Mask R-CNN's RoI heads) and ``sigmoid_focal_loss`` (RetinaNet's loss; mmdet
uses mmcv's kernel whenever the tensor is on CUDA) are run on CUDA tensors and compared
with mmcv's CPU kernels (nms, roi_align) or, since mmcv has no CPU focal loss, with the
focal loss written out in torch (Lin et al. 2017), forward and gradient. Prints one line
per op; any failure is one ``error:`` line and exit status 1. Run by
``tools/setup_env.sh`` after a CUDA install and by ``tools/deployment/gpu_checks.sh``.
"""

import torch
import torch.nn.functional as F

from mmcirc.cli.common import CLIError, error_line, main_guard


def _boxes(n, gen, size=64.0):
    xy = torch.rand(n, 2, generator=gen) * size
    wh = torch.rand(n, 2, generator=gen) * size / 2 + 1
    return torch.cat([xy, xy + wh], 1)  # (n, 4) x1 y1 x2 y2


def check_nms(gen):
    from mmcv.ops import nms

    boxes, scores = _boxes(300, gen), torch.rand(300, generator=gen)
    _, keep_cpu = nms(boxes, scores, 0.5)
    dets, keep_cuda = nms(boxes.cuda(), scores.cuda(), 0.5)
    if dets.device.type != 'cuda':
        raise CLIError(f'nms returned {dets.device} tensors for CUDA input')
    if not torch.equal(keep_cuda.cpu(), keep_cpu):
        raise CLIError(
            f'nms: CUDA keeps {keep_cuda.numel()} boxes, CPU {keep_cpu.numel()}, '
            f'{(keep_cuda.cpu()[: keep_cpu.numel()] != keep_cpu[: keep_cuda.numel()]).sum()} differ'
        )
    return f'nms: CUDA keeps the same {keep_cpu.numel()} of 300 boxes as the CPU kernel'


def check_roi_align(gen):
    from mmcv.ops import roi_align

    feats = torch.randn(2, 8, 32, 40, generator=gen)  # (B, C, H, W)
    boxes = _boxes(16, gen, size=120.0)
    rois = torch.cat([torch.randint(0, 2, (16, 1), generator=gen).float(), boxes], 1)
    cpu = roi_align(feats, rois, (7, 7), 0.25, 2, 'avg', True)  # (16, 8, 7, 7)
    cuda = roi_align(feats.cuda(), rois.cuda(), (7, 7), 0.25, 2, 'avg', True)
    err = (cuda.cpu() - cpu).abs().max().item()
    if not torch.allclose(cuda.cpu(), cpu, rtol=1e-4, atol=1e-5):
        raise CLIError(f'roi_align: CUDA differs from the CPU kernel by up to {err:.3g}')
    return f'roi_align: CUDA matches the CPU kernel (max abs diff {err:.2g})'


def focal_loss_reference(logits, labels, gamma=2.0, alpha=0.25):
    """(N, C) per-element sigmoid focal loss; label C is background (no positive)."""
    t = F.one_hot(labels, logits.size(1) + 1)[:, :-1].to(logits.dtype)  # (N, C)
    p = logits.sigmoid()
    pt = p * t + (1 - p) * (1 - t)
    ce = F.binary_cross_entropy_with_logits(logits, t, reduction='none')
    return ce * (1 - pt).pow(gamma) * (alpha * t + (1 - alpha) * (1 - t))


def check_sigmoid_focal_loss(gen):
    from mmcv.ops import sigmoid_focal_loss

    logits = torch.randn(64, 5, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 6, (64,), generator=gen)  # 5 = background
    x64 = logits.clone().requires_grad_()
    ref = focal_loss_reference(x64, labels)
    ref.sum().backward()
    x = logits.float().cuda().requires_grad_()
    out = sigmoid_focal_loss(x, labels.cuda(), 2.0, 0.25, None, 'none')  # (64, 5)
    out.sum().backward()
    err = (out.detach().cpu().double() - ref.detach()).abs().max().item()
    gerr = (x.grad.cpu().double() - x64.grad).abs().max().item()
    if not torch.allclose(out.detach().cpu().double(), ref.detach(), rtol=1e-4, atol=1e-6):
        raise CLIError(f'sigmoid_focal_loss: CUDA differs from the reference by {err:.3g}')
    if not torch.allclose(x.grad.cpu().double(), x64.grad, rtol=1e-4, atol=1e-6):
        raise CLIError(f'sigmoid_focal_loss: CUDA gradient differs by {gerr:.3g}')
    return f'sigmoid_focal_loss: CUDA matches the torch formula (loss {err:.2g}, grad {gerr:.2g})'


@main_guard
def main():
    if not torch.cuda.is_available():
        raise CLIError('torch sees no CUDA device (torch.cuda.is_available() is False)')
    try:
        from mmcv.ops import get_compiling_cuda_version

        built = get_compiling_cuda_version()
        if built == 'not available':
            raise CLIError(
                'mmcv was built without CUDA ops (get_compiling_cuda_version() is '
                "'not available'); rebuild it: MMCIRC_CUDA=1 bash tools/setup_env.sh"
            )
        print(
            f'mmcv ops built with CUDA {built}, torch {torch.__version__} on '
            f'{torch.cuda.get_device_name()}'
        )
        for check in (check_nms, check_roi_align, check_sigmoid_focal_loss):
            print(check(torch.Generator().manual_seed(0)))
    except (ImportError, RuntimeError) as err:
        raise CLIError(error_line(err)) from None
