"""ONNX export of the released isotropic models (CA-DeiT, VECA) and of CA-Swin /
Core-Swin in mmseg / mmdet models, checked with ONNX Runtime against the model in torch
(default FFT path); the exact adaptive pooling a dynamic graph uses; the refusal of
dynamic Swin windows.
"""

import os
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from helpers import FIXTURE_CONFIGS

pytest.importorskip('onnxscript', reason='pip install -r requirements.txt (onnx, onnxscript)')
ort = pytest.importorskip('onnxruntime', reason='pip install -r requirements.txt (onnxruntime)')

from mmcirc.apis.builder import build_model  # noqa: E402
from mmcirc.deployment.onnx import (  # noqa: E402
    ExportError,
    TensorModel,
    adaptive_avg_pool2d_matmul,
    check_exportable,
    export_onnx,
)
from mmcirc.apis.builder import load_model_config  # noqa: E402

pytestmark = pytest.mark.usefixtures('two_torch_threads')

CADEIT_SEG = osp.join(FIXTURE_CONFIGS, 'ca_deit_upernet_tiny.py')
VECA_SEG = osp.join(FIXTURE_CONFIGS, 'veca_upernet_tiny.py')
CADEIT_DET = osp.join(FIXTURE_CONFIGS, 'ca_deit_mask-rcnn_tiny.py')
SWIN_SEG = osp.join(FIXTURE_CONFIGS, 'ca_swin_upernet_tiny.py')
CORESWIN_DET = osp.join(FIXTURE_CONFIGS, 'core_swin_mask-rcnn_tiny.py')
# two blocks in the window stages 3-4, so that the graph holds a shifted block (every
# second one) and, at 64x96, a padded map (stage 4: 2x3 with window 2)
SWIN_DEPTHS = {'model.backbone.arch.depths': (1, 1, 2, 2)}


def _model(config, options=None):
    torch.manual_seed(0)
    return build_model(load_model_config(config, options))


def _check_in_onnxruntime(path, tensor_model, shape):
    """Independent of the tool's check: every output against torch at ``shape``."""
    sess = ort.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = tensor_model(x)
    outs = sess.run(None, {'input': x.numpy()})
    assert len(outs) == len(ref)
    for o, r in zip(outs, ref):
        assert o.shape == tuple(r.shape)
        torch.testing.assert_close(torch.from_numpy(o), r, rtol=0, atol=1e-4 * float(r.abs().max()))
    return ref


@pytest.mark.parametrize(
    'config,backbone,features',
    [(CADEIT_SEG, 'CADeiT', False), (VECA_SEG, 'VECAViT', False), (CADEIT_DET, 'CADeiT', True)],
    ids=['ca-deit-upernet', 'veca-upernet', 'ca-deit-mask-rcnn-features'],
)
def test_static_export_matches_torch(tmp_path, config, backbone, features):
    model = _model(config)
    assert type(model.backbone).__name__ == backbone
    tensor_model = TensorModel(model, features=features)
    out = tmp_path / 'm.onnx'
    res = export_onnx(tensor_model, (64, 96), str(out), verify=True)
    assert os.listdir(tmp_path) == ['m.onnx']
    assert res['verify'][0]['max_rel_err'] <= 1e-4
    ref = _check_in_onnxruntime(out, tensor_model, (1, 3, 64, 96))
    if features:  # simple feature pyramid: strides 4, 8, 16, 32, 64
        assert [tuple(r.shape[-2:]) for r in ref] == [(16, 24), (8, 12), (4, 6), (2, 3), (1, 2)]
    else:  # UperNet logits at 1/4 of the input
        assert len(ref) == 1 and tuple(ref[0].shape) == (1, 5, 16, 24)


@pytest.mark.parametrize('config', [CADEIT_SEG, VECA_SEG], ids=['ca-deit-upernet', 'veca-upernet'])
def test_dynamic_export_serves_several_sizes(tmp_path, config):
    """One file: the tool's check at 64x96 and 96x64 (batch 2), and here a third,
    larger non-square size."""
    tensor_model = TensorModel(_model(config))
    out = tmp_path / 'm.onnx'
    res = export_onnx(tensor_model, (64, 96), str(out), dynamic=True, verify=True)
    assert [r['shape'] for r in res['verify']] == [[1, 3, 64, 96], [2, 3, 96, 64]]
    assert os.listdir(tmp_path) == ['m.onnx']
    ref = _check_in_onnxruntime(out, tensor_model, (1, 3, 128, 64))
    assert tuple(ref[0].shape) == (1, 5, 32, 16)


@pytest.mark.parametrize('size', [(2, 3), (9, 11), (7, 5), (1, 1), (13, 6)])
def test_matmul_adaptive_pooling_equals_torch(size):
    """PSP/UperNet pool scales, divisible or not, against torch's kernel (float64)."""
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    for out in (1, 2, 3, 6, (3, None)):
        ref = F.adaptive_avg_pool2d(x, out)
        got = adaptive_avg_pool2d_matmul(x, out)
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    'config,backbone,attention,features',
    [(SWIN_SEG, 'CASwin', 'circulant', False), (CORESWIN_DET, 'CoreSwin', 'core', True)],
    ids=['ca-swin-upernet', 'core-swin-mask-rcnn-features'],
)
def test_static_swin_export_with_window_stages_matches_torch(
    tmp_path, config, backbone, attention, features
):
    """The default stages: circulant or core in 1-2, mmdet's shifted-window SwinBlock in
    3-4 (unshifted and shifted, padded at stage 4), exported at 64x96."""
    from mmdet.models.backbones.swin import SwinBlock

    model = _model(config, SWIN_DEPTHS)
    assert type(model.backbone).__name__ == backbone
    assert tuple(model.backbone.stage_attentions) == (attention, attention, 'window', 'window')
    shifts = [m.attn.shift_size for m in model.modules() if isinstance(m, SwinBlock)]
    assert shifts == [0, 1, 0, 1]
    tensor_model = TensorModel(model, features=features)
    out = tmp_path / 'm.onnx'
    res = export_onnx(tensor_model, (64, 96), str(out), verify=True)
    assert os.listdir(tmp_path) == ['m.onnx']
    assert [r['shape'] for r in res['verify']] == [[1, 3, 64, 96]]
    assert res['verify'][0]['max_rel_err'] <= 1e-4
    ref = _check_in_onnxruntime(out, tensor_model, (1, 3, 64, 96))
    if features:  # FPN: strides 4, 8, 16, 32 and the extra max-pooled level
        assert [tuple(r.shape[-2:]) for r in ref] == [(16, 24), (8, 12), (4, 6), (2, 3), (1, 2)]
    else:  # UperNet logits at 1/4 of the input
        assert len(ref) == 1 and tuple(ref[0].shape) == (1, 5, 16, 24)


def test_dynamic_swin_with_circulant_and_core_stages_serves_two_sizes(tmp_path):
    """No window stage: one file, the tool's check at 64x96 and 96x64 (batch 2)."""
    from mmdet.models.backbones.swin import SwinBlock

    attentions = ('circulant', 'core', 'circulant', 'core')
    model = _model(SWIN_SEG, {'model.backbone.stage_attentions': attentions})
    assert tuple(model.backbone.stage_attentions) == attentions
    assert not any(isinstance(m, SwinBlock) for m in model.modules())
    tensor_model = TensorModel(model)
    out = tmp_path / 'm.onnx'
    res = export_onnx(tensor_model, (64, 96), str(out), dynamic=True, verify=True)
    assert [r['shape'] for r in res['verify']] == [[1, 3, 64, 96], [2, 3, 96, 64]]
    assert all(r['max_rel_err'] <= 1e-4 for r in res['verify'])
    assert os.listdir(tmp_path) == ['m.onnx']
    ref = _check_in_onnxruntime(out, tensor_model, (2, 3, 96, 64))
    assert tuple(ref[0].shape) == (2, 5, 24, 16)


def test_dynamic_swin_window_stage_is_refused_naming_layer_and_options():
    model = _model(SWIN_SEG)
    assert model.backbone.stage_attentions[2] == 'window'
    with pytest.raises(
        ExportError,
        match=r'^layer backbone\.stages\.2\.blocks\.0 \(WindowBlock in '
        r'stage 3, .*without --dynamic.*stage_attentions',
    ):
        check_exportable(model, dynamic=True)
    check_exportable(model, dynamic=False)  # a fixed size exports
    # the same backbone with circulant / core stages has nothing to refuse
    check_exportable(
        _model(
            SWIN_SEG,
            {'model.backbone.stage_attentions': ['circulant', 'circulant', 'core', 'core']},
        ),
        dynamic=True,
    )
