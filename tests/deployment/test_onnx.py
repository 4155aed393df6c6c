"""ONNX export of whole models (mmcirc.deployment.onnx), checked with ONNX Runtime.

Each exported model holds two attention kinds, so that a detector and a segmentor
cover circulant (circular and zero boundary) and core attention: stage 1 circulant,
stage 2 core, stages 3-4 PVT's spatial-reduction attention. The reference is the
model in torch on the default (torch.fft) path. Dynamic sizes: the attention layers
alone at three sizes of one graph, and a whole detector.
"""

import os
import os.path as osp

import pytest
import torch

from helpers import FIXTURE_CONFIGS

pytest.importorskip('onnxscript', reason='pip install -r requirements.txt (onnx, onnxscript)')
ort = pytest.importorskip('onnxruntime', reason='pip install -r requirements.txt (onnxruntime)')

from mmcirc.apis.builder import build_model  # noqa: E402
from mmcirc.deployment.onnx import (  # noqa: E402
    ExportError,
    TensorModel,
    check_exportable,
    export_onnx,
    second_shape,
)
from mmcirc.apis.builder import load_model_config  # noqa: E402

pytestmark = pytest.mark.usefixtures('two_torch_threads')

DET = osp.join(FIXTURE_CONFIGS, 'ca_pvt_retinanet_tiny.py')
SEG = osp.join(FIXTURE_CONFIGS, 'ca_pvt_fpn_tiny.py')
MIXED = ('circulant', 'core', 'sra', 'sra')


def _model(config, boundary='circular', **backbone):
    opts = {
        'model.backbone.stage_attentions': MIXED,
        'model.backbone.boundary': boundary,
        'model.backbone.num_cores_max': 4,
    }
    opts.update({f'model.backbone.{k}': v for k, v in backbone.items()})
    torch.manual_seed(0)
    return build_model(load_model_config(config, opts))


def _kinds(model):
    from mmcirc.ops.circulant import CirculantAttention
    from mmcirc.ops.core import CoreAttention

    kinds = set()
    for m in model.modules():
        if isinstance(m, CirculantAttention):
            kinds.add(m.boundary)
        elif isinstance(m, CoreAttention):
            kinds.add('core')
    return kinds


class _Layers(torch.nn.Module):
    """Circulant (circular, d = 1), circulant (zero, 2 heads) and core attention on the
    tokens of a (B, C, H, W) map."""

    def __init__(self, c=4):
        super().__init__()
        from mmcirc.ops.circulant import CirculantAttention
        from mmcirc.ops.core import CoreAttention

        self.circ = CirculantAttention(c, boundary='circular')
        self.zero = CirculantAttention(c, num_heads=2, boundary='zero')
        self.core = CoreAttention(c, 2)
        self.bank = torch.nn.Parameter(torch.randn(3, c))

    def forward(self, img):
        b, c, h, w = img.shape
        x = img.flatten(2).transpose(1, 2)  # (B, N, C)
        x = x + self.circ(x, (h, w))
        x = x + self.zero(x, (h, w))
        y, _ = self.core(x, self.bank.unsqueeze(0).expand(b, -1, -1))
        return x + y


def test_attention_layers_export_with_dynamic_sizes(tmp_path):
    """One graph, DFT lengths following H and W: equal to torch (default path) at
    three sizes, non-square and odd among them."""
    from mmcirc.ops.settings import export_mode

    torch.manual_seed(0)
    model = _Layers().eval()
    dim = torch.export.Dim
    example = torch.randn(2, 4, 7, 12)
    with export_mode(), torch.no_grad():
        program = torch.onnx.export(
            model,
            (example,),
            dynamo=True,
            input_names=['img'],
            dynamic_shapes=(
                {
                    0: dim('b', min=1, max=64),
                    2: dim('h', min=1, max=512),
                    3: dim('w', min=1, max=512),
                },
            ),
        )
    program.save(str(tmp_path / 'layers.onnx'))
    sess = ort.InferenceSession(str(tmp_path / 'layers.onnx'), providers=['CPUExecutionProvider'])
    for shape in [(1, 4, 6, 10), (2, 4, 9, 5), (1, 4, 8, 8)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            ref = model(x)
        (out,) = sess.run(None, {'img': x.numpy()})
        torch.testing.assert_close(
            torch.from_numpy(out), ref, rtol=0, atol=1e-4 * float(ref.abs().max())
        )


@pytest.mark.parametrize(
    'config,boundary',
    [(DET, 'circular'), (SEG, 'zero')],
    ids=['retinanet-circular+core', 'fpn-zero+core'],
)
def test_export_matches_torch_in_onnxruntime(tmp_path, config, boundary):
    model = _model(config, boundary)
    assert _kinds(model) == {boundary, 'core'}
    out = tmp_path / 'model.onnx'
    res = export_onnx(TensorModel(model), (64, 96), str(out), verify=True)
    assert out.is_file() and os.listdir(tmp_path) == ['model.onnx']
    assert [r['shape'] for r in res['verify']] == [[1, 3, 64, 96]]
    # independent check here, output by output against the model in torch
    sess = ort.InferenceSession(str(out), providers=['CPUExecutionProvider'])
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        ref = TensorModel(model)(x)
    outs = sess.run(None, {'input': x.numpy()})
    assert len(outs) == len(ref) == len(res['outputs'])
    if config == DET:  # RetinaNet: class scores and boxes for 5 levels
        assert len(ref) == 10 and tuple(ref[0].shape[-2:]) == (8, 12)
    else:  # Semantic FPN: logits at 1/4 of the input
        assert len(ref) == 1 and tuple(ref[0].shape[-2:]) == (16, 24)
    for o, r in zip(outs, ref):
        assert o.shape == tuple(r.shape)
        torch.testing.assert_close(torch.from_numpy(o), r, rtol=0, atol=1e-4 * float(r.abs().max()))


def test_dynamic_pyramid_export_matches_torch_at_two_sizes(tmp_path):
    model = _model(DET, 'zero')
    out = tmp_path / 'det.onnx'
    res = export_onnx(TensorModel(model), (64, 96), str(out), dynamic=True, verify=True)
    # the tool's check ran at the export size and a non-square second size, batch 2
    assert [r['shape'] for r in res['verify']] == [[1, 3, 64, 96], [2, 3, 96, 64]]
    assert all(r['max_rel_err'] <= 1e-4 for r in res['verify'])
    assert os.listdir(tmp_path) == ['det.onnx']


def test_failed_verification_leaves_no_file(tmp_path, monkeypatch):
    """Fault injection: the graph is written, then the ONNX Runtime check fails; the
    temporary file is removed and no FILE.onnx appears."""
    from mmcirc.deployment import onnx as dep

    written = []

    class _Program:
        def save(self, path):
            written.append(path)
            with open(path, 'wb') as f:
                f.write(b'partial')

    def _fail(path, *args, **kwargs):
        assert os.path.getsize(path) == 7  # the written temporary file is checked
        raise ExportError('ONNX Runtime differs from torch at 64x96')

    monkeypatch.setattr(dep, '_export', lambda *args, **kwargs: _Program())
    monkeypatch.setattr(dep, 'verify_onnx', _fail)
    with pytest.raises(ExportError, match='differs'):
        dep.export_onnx(TensorModel(_model(SEG)), (64, 96), str(tmp_path / 'seg.onnx'), verify=True)
    assert written and osp.dirname(written[0]) == str(tmp_path)  # temp file in the folder
    assert os.listdir(tmp_path) == []


def test_chunked_core_gather_cannot_be_dynamic():
    model = _model(DET, core_chunk_size=16)
    with pytest.raises(
        ExportError,
        match=r'layer backbone\.layers\.1\.blocks\.0\.attn '
        r'\(CoreAttention, chunk_size=16\).*'
        r'core_chunk_size=None',
    ):
        check_exportable(model, dynamic=True)
    check_exportable(model, dynamic=False)  # a fixed size unrolls the loop


def test_two_stage_detector_is_refused_with_features_hint():
    cfg = load_model_config(osp.join(FIXTURE_CONFIGS, 'core_swin_mask-rcnn_tiny.py'))
    model = build_model(cfg)
    with pytest.raises(ExportError, match='two-stage detector.*--features'):
        TensorModel(model)
    feats = TensorModel(model, features=True)(torch.randn(1, 3, 64, 64))
    assert len(feats) == 5  # FPN levels


def test_shape_below_minimum_is_refused_before_export(tmp_path):
    model = _model(DET)
    with pytest.raises(ExportError, match=r'shape 8x96'):
        export_onnx(TensorModel(model), (8, 96), str(tmp_path / 'm.onnx'))
    assert os.listdir(tmp_path) == []


def test_second_shape_is_non_square_and_different():
    for shape in [(64, 96), (64, 64), (1, 1)]:
        h, w = second_shape(shape)
        assert h != w and (h, w) != shape
