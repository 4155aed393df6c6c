"""ONNX export of whole mmcirc models (mmdet, mmseg, mmpretrain) and its check.

What is exported is the network, ``model(inputs, mode='tensor')``, on a preprocessed
batch: ``inputs`` (B, 3, H, W) float32, normalised and channel-ordered as the model's
``data_preprocessor`` makes it (mmdeploy's convention: preprocessing and
post-processing stay with the caller); its outputs flattened depth-first to
``output.<i>[.<j>]`` (per kind of model: docs/deployment.md). Two-stage detectors
export their backbone + neck only (``features=True``, :class:`TensorModel`).

The model to export is :func:`mmcirc.apis.builder.build_model`'s (CPU, eval mode,
SyncBN reverted; random ``init_weights`` without a checkpoint).

Circulant attention exports through :func:`mmcirc.ops.settings.export_mode` (real
matmul DFTs built from the runtime H and W, so a dynamic-shape graph follows the
input size). The exporter is torch's dynamo-based ``torch.onnx.export(...,
dynamo=True)`` (``torch.export`` + onnxscript); the TorchScript exporter cannot express
the data-dependent sizes and is deprecated. With a dynamic graph, adaptive average
pooling (PSP / UperNet pool scales) exports as masked-mean matrix products
(:func:`adaptive_avg_pool2d_matmul`), exact at every size; Swin's shifted-window
blocks are refused (:func:`check_exportable`).
"""

import contextlib
import os
import os.path as osp
import re
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from mmcirc.utils.fileio import discard

__all__ = [
    'ExportError',
    'TensorModel',
    'check_exportable',
    'export_onnx',
    'verify_onnx',
    'output_names',
    'second_shape',
    'adaptive_avg_pool2d_matmul',
]

DEFAULT_OPSET = 18
DEFAULT_SIZE_DIVISOR = 32  # total stride of the PVT and Swin pyramids
RTOL = 1e-4


class ExportError(ValueError):
    """A model, option or shape that cannot be exported (message names the cause)."""


# --------------------------------------------------------------------------- model
def _leaves(out, prefix: str) -> List[Tuple[str, torch.Tensor]]:
    """(``prefix.<i>[.<j>...]``, tensor) of the tensors of a nested output, depth-first."""
    if isinstance(out, torch.Tensor):
        return [(prefix, out)]
    if not isinstance(out, (dict, list, tuple)):
        raise ExportError(
            f'model output of type {type(out).__name__} is not a tensor or a nest of tensors'
        )
    items = out.items() if isinstance(out, dict) else enumerate(out)
    return [leaf for k, o in items for leaf in _leaves(o, f'{prefix}.{k}')]


def output_names(out, prefix: str = 'output') -> List[str]:
    """``output.<i>[.<j>...]`` for the tensors of a nested output, depth-first."""
    return [name for name, _ in _leaves(out, prefix)]


class TensorModel(nn.Module):
    """``model(inputs, mode='tensor')`` (or ``model.extract_feat`` with ``features``),
    outputs flattened to a tuple of tensors."""

    def __init__(self, model: nn.Module, features: bool = False):
        super().__init__()
        two_stage = any(getattr(model, k, None) is not None for k in ('rpn_head', 'roi_head'))
        if not features and two_stage:
            raise ExportError(
                f"{type(model).__name__} is a two-stage detector: its mode='tensor' runs the "
                "RPN's proposal NMS and needs image metas, which an ONNX graph of the network "
                'does not take; export its backbone + neck with --features, or a single-stage '
                'detector (RetinaNet)'
            )
        self.model = model
        self.features = features

    def raw(self, inputs: torch.Tensor):
        if self.features:
            return self.model.extract_feat(inputs)
        return self.model(inputs, mode='tensor')

    def forward(self, inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return tuple(t for _, t in _leaves(self.raw(inputs), 'output'))


# --------------------------------------------------------------------------- checks
def check_exportable(model: nn.Module, dynamic: bool) -> None:
    """Raise :class:`ExportError` naming a layer that cannot be exported, and the option
    that avoids it."""
    from mmcirc.ops.core import CoreAttention

    try:
        from mmdet.models.backbones.swin import SwinBlock
    except ImportError:  # no mmdet: no Swin blocks either
        SwinBlock = ()
    for name, module in model.named_modules():
        if isinstance(module, SwinBlock) and dynamic:
            match = re.search(r'(?:layers|stages)\.(\d+)\.', name)
            stage = f' in stage {int(match.group(1)) + 1}' if match else ''
            raise ExportError(
                f'layer {name} ({type(module).__name__}{stage}, shifted-window attention) has no '
                '--dynamic export: its window padding, partition and shift mask are rebuilt from '
                'the symbolic H and W and torch.export does not finish in reasonable time; export '
                'without --dynamic (one file per size) or use circulant/core attention in that '
                'stage (model.backbone.stage_attentions)'
            )
        if isinstance(module, CoreAttention) and dynamic and module.chunk_size is not None:
            raise ExportError(
                f'layer {name} (CoreAttention, chunk_size={module.chunk_size}) streams the core '
                'gather over chunks of patches: a loop whose length follows the input size, '
                'which a --dynamic graph cannot hold; set the backbone option '
                'core_chunk_size=None (--cfg-options model.backbone.core_chunk_size=None) or '
                'export without --dynamic (a fixed size unrolls the loop)'
            )


def check_shape(model: nn.Module, shape: Sequence[int]) -> None:
    """Raise :class:`ExportError` for an input size below the backbone's
    ``min_input_size`` (1 if it does not say)."""
    h, w = shape
    minimum = getattr(getattr(model, 'backbone', None), 'min_input_size', None)
    minimum = int(minimum) if isinstance(minimum, int) else 1
    if min(h, w) < minimum:
        raise ExportError(
            f'shape {h}x{w} is below the minimum input size {minimum}x{minimum} of '
            f'{type(getattr(model, "backbone", model)).__name__}'
        )


def second_shape(shape: Sequence[int], size_divisor: int = 1) -> Tuple[int, int]:
    """The second size ``verify`` checks a dynamic graph at: non-square and different
    from ``shape`` (H and W swapped, or W + ``size_divisor`` for a square shape)."""
    h, w = shape
    return (w, h) if h != w else (h, w + size_divisor)


# --------------------------------------------------------------------------- pooling
def _pool_matrix(size, out: int, like: torch.Tensor) -> torch.Tensor:
    """(out, size) averaging matrix of adaptive pooling along one axis: row i averages
    the cells floor(i size / out) .. ceil((i + 1) size / out) - 1 (PyTorch's bins)."""
    i = torch.arange(out, device=like.device).unsqueeze(1)  # (out, 1)
    j = torch.arange(size, device=like.device).unsqueeze(0)  # (1, size)
    start = torch.div(i * size, out, rounding_mode='floor')
    end = torch.div((i + 1) * size + out - 1, out, rounding_mode='floor')
    mask = ((j >= start) & (j < end)).to(like.dtype)  # (out, size)
    return mask / mask.sum(1, keepdim=True)


def adaptive_avg_pool2d_matmul(x: torch.Tensor, output_size) -> torch.Tensor:
    """``F.adaptive_avg_pool2d`` as two matrix products, x (..., H, W) -> (..., h, w).

    torch's decomposition of adaptive pooling (what ``torch.onnx.export`` emits)
    unrolls the longest bin of the traced size into a fixed number of gathers, which
    index out of range (or average the wrong cells) at other input sizes; here the
    bins are masks built from the runtime H and W, so a dynamic graph stays exact.
    """
    if isinstance(output_size, int):
        output_size = (output_size, output_size)
    out_h, out_w = output_size
    h, w = x.shape[-2], x.shape[-1]
    if out_h is not None:
        x = torch.matmul(_pool_matrix(h, out_h, x), x)  # (..., h', W)
    if out_w is not None:
        x = torch.matmul(x, _pool_matrix(w, out_w, x).transpose(0, 1))  # (..., h', w')
    return x


@contextlib.contextmanager
def _matmul_adaptive_pooling(model: nn.Module, enabled: bool = True):
    """Every ``nn.AdaptiveAvgPool2d`` of ``model`` runs :func:`adaptive_avg_pool2d_matmul`
    while active (an instance ``forward``, removed on exit)."""
    pools = [m for m in model.modules() if isinstance(m, nn.AdaptiveAvgPool2d)] if enabled else []
    for m in pools:
        m.forward = lambda x, size=m.output_size: adaptive_avg_pool2d_matmul(x, size)
    try:
        yield
    finally:
        for m in pools:
            del m.forward


# --------------------------------------------------------------------------- export
@contextlib.contextmanager
def _running_layers(model: nn.Module):
    """Yields the stack of the modules of ``model`` being run (innermost last), to name
    the one where tracing failed."""
    stack, handles = [], []

    def leave(module, args, out):
        if stack:
            stack.pop()

    for name, module in model.named_modules():
        label = f'{name or "model"} ({type(module).__name__})'
        handles.append(module.register_forward_pre_hook(lambda m, a, x=label: stack.append(x)))
        handles.append(module.register_forward_hook(leave))
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith('['):
            return f'{type(err).__name__}: {line}'[:400]
    return type(err).__name__


def _dynamic_shapes(dynamic: bool, size_divisor: int):
    """Batch symbolic; H and W symbolic multiples of ``size_divisor``."""
    if not dynamic:
        return None
    dim = torch.export.Dim
    return (
        {
            0: dim('batch', min=1, max=1024),
            2: size_divisor * dim('height_blocks', min=1, max=16384 // size_divisor),
            3: size_divisor * dim('width_blocks', min=1, max=16384 // size_divisor),
        },
    )


def _constraint_summary(err: BaseException) -> str:
    """The bullet lines of a torch.export constraint violation, joined."""
    lines = [ln.strip(' -') for ln in str(err).splitlines() if ln.strip().startswith('- ')]
    return '; '.join(lines[:3])[:600] or _first_line(err)


def _export(tensor_model, example, names, dynamic, size_divisor, opset):
    """torch.export (non-strict) in export mode, then the ONNX translation."""
    from mmcirc.ops.settings import export_mode

    with _running_layers(tensor_model) as running:
        try:
            with export_mode(), torch.no_grad(), _matmul_adaptive_pooling(tensor_model, dynamic):
                program = torch.export.export(
                    tensor_model,
                    (example,),
                    dynamic_shapes=_dynamic_shapes(dynamic, size_divisor),
                    strict=False,
                )
        except torch._dynamo.exc.UserError as err:  # constraint violations: sizes specialised
            raise ExportError(
                'torch.export could not keep batch/H/W symbolic (a layer turns a size into a '
                f'Python int or branches on it): {_constraint_summary(err)}; export without '
                "--dynamic, or with --size-divisor matching the model's stride"
            ) from err
        except Exception as err:  # noqa: BLE001
            where = f' in layer {running[-1]}' if running else ''
            raise ExportError(f'torch.export failed{where}: {_first_line(err)}') from err
    try:
        with export_mode(), torch.no_grad():
            return torch.onnx.export(
                program,
                (example,),
                dynamo=True,
                input_names=['input'],
                output_names=names,
                opset_version=opset,
                external_data=False,
                verbose=False,
            )
    except Exception as err:  # noqa: BLE001
        raise ExportError(f'translation to ONNX failed: {_first_line(err)}') from err


def export_onnx(
    tensor_model: TensorModel,
    shape: Sequence[int],
    out: str,
    *,
    dynamic: bool = False,
    size_divisor: int = DEFAULT_SIZE_DIVISOR,
    opset: int = DEFAULT_OPSET,
    in_channels: int = 3,
    verify: bool = False,
    rtol: float = RTOL,
) -> Dict:
    """Export ``tensor_model`` at ``shape`` (H, W) to ``out`` atomically.

    The graph is written to a temporary file in ``out``'s folder and renamed over
    ``out`` only when export (and, with ``verify``, the ONNX Runtime check) succeeded;
    on any failure nothing is left. ``dynamic``: batch, H and W are symbolic, H and W
    multiples of ``size_divisor`` (the total stride of the pyramid: the patch
    embeddings' padding branches are then resolved at export; pad other sizes up, as
    mmdet's ``pad_size_divisor`` does); the example batch is 2 (torch.export
    specialises size-1 dimensions).

    Returns a dict with the output names and, with ``verify``, the check per size.
    """
    model = tensor_model.model
    tensor_model.eval()
    check_shape(model, shape)
    check_exportable(model, dynamic)
    h, w = shape
    if dynamic and (h % size_divisor or w % size_divisor):
        raise ExportError(
            f'shape {h}x{w}: a dynamic graph takes H and W that are multiples of '
            f'size_divisor={size_divisor} (the total stride); pick such a shape'
        )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        try:  # eager, default path: does the model run at this size?
            sample = tensor_model.raw(torch.randn(1, in_channels, h, w, generator=gen))
        except Exception as err:  # noqa: BLE001  (any failure of the model at this size)
            raise ExportError(
                f'the model does not run at shape {h}x{w}: {_first_line(err)}'
            ) from err
    names = output_names(sample)
    # the traced example: for a dynamic graph, batch 2 and H, W odd, different
    # multiples of size_divisor, so that no map of the pyramid (RetinaNet's P7 is 1/128)
    # has size 1 and H != W: torch.export specialises sizes 0/1 and equal sizes
    example = (
        torch.randn(2, in_channels, 9 * size_divisor, 11 * size_divisor, generator=gen)
        if dynamic
        else torch.randn(1, in_channels, h, w, generator=gen)
    )
    out = osp.abspath(out)
    folder = osp.dirname(out)
    os.makedirs(folder, exist_ok=True)
    # a fresh name the exporter creates as open() does (the umask's mode, not mkstemp's 0600)
    tmp = osp.join(folder, f'.{osp.basename(out)}.{os.getpid()}.{os.urandom(4).hex()}.tmp')
    try:
        program = _export(tensor_model, example, names, dynamic, size_divisor, opset)
        program.save(tmp)
        result = dict(outputs=names, dynamic=dynamic, opset=opset)
        if verify:
            shapes = [(1, h, w)] + ([(2,) + second_shape(shape, size_divisor)] if dynamic else [])
            result['verify'] = verify_onnx(tmp, tensor_model, shapes, in_channels, rtol)
        os.replace(tmp, out)
    except BaseException:
        discard(tmp)
        raise
    return result


def verify_onnx(
    path: str,
    tensor_model: TensorModel,
    shapes: Sequence[Tuple[int, int, int]],
    in_channels: int = 3,
    rtol: float = RTOL,
) -> List[dict]:
    """Run the ONNX file in ONNX Runtime (CPU) and compare with torch (default path).

    ``shapes``: (B, H, W) inputs. The error of an output is max|onnx - torch| over
    max|torch|; raises :class:`ExportError` when one exceeds ``rtol``. Returns one dict
    per shape: ``shape``, ``max_rel_err``.
    """
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    input_name = sess.get_inputs()[0].name
    report = []
    for b, h, w in shapes:
        x = torch.randn(b, in_channels, h, w, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            ref = tensor_model(x)
        outs = sess.run(None, {input_name: x.numpy()})
        if len(outs) != len(ref):
            raise ExportError(f'ONNX Runtime gave {len(outs)} outputs at {h}x{w}, torch {len(ref)}')
        worst = 0.0
        for i, (o, r) in enumerate(zip(outs, ref)):
            if tuple(o.shape) != tuple(r.shape):
                raise ExportError(
                    f'output {i} at {b}x{in_channels}x{h}x{w}: ONNX Runtime shape '
                    f'{tuple(o.shape)}, torch {tuple(r.shape)}'
                )
            scale = float(r.abs().max()) or 1.0
            err = float((torch.from_numpy(o) - r).abs().max()) / scale
            worst = max(worst, err)
        report.append(dict(shape=[b, in_channels, h, w], max_rel_err=worst))
        if not worst <= rtol:
            raise ExportError(
                f'ONNX Runtime differs from torch at {h}x{w} (batch {b}): max '
                f'relative error {worst:.2e} > {rtol:g}'
            )
    return report
