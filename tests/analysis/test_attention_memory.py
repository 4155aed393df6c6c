"""mmcirc.analysis.attention_memory: the attention-matrix memory of the stages that materialise one
(token grids checked against a real forward), and the one-line warning where it does not
fit; models without such stages have none."""

import os.path as osp

import pytest
import torch

from helpers import REPO
from helpers import VECA_UPERNET as VECA
from helpers import tiny_isotropic_config as isotropic_config
from mmcirc.analysis.attention_memory import (
    memory_budget,
    quadratic_attention_estimates,
    quadratic_warning,
)
from mmcirc.apis import build_model, load_highres_config

TINY = """_base_ = {base!r}
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])),
    neck=dict(in_channels=[8, 16, 24, 32], out_channels=8),
    decode_head=dict(in_channels=[8, 8, 8, 8], channels=8))
"""


def tiny_config(tmp_path, base='ca_pvt_t-allcirc_fpn_80k_ade20k.py'):
    path = tmp_path / 'tiny.py'
    path.write_text(TINY.format(base=osp.join(REPO, 'configs', base)))
    return str(path)


@pytest.mark.parametrize(
    'base,attn',
    [('ca_pvt_t-allcirc_fpn_80k_ade20k.py', 'sra'), ('ca_swin_t_upernet_160k_ade20k.py', 'window')],
)
def test_every_stage_of_the_kind_has_an_estimate(tmp_path, base, attn):
    from mmengine.config import Config
    from mmseg.registry import MODELS

    bcfg = Config.fromfile(osp.join(REPO, 'configs', base)).model.backbone
    bcfg.update(init_cfg=None, stage_attentions=attn)
    bcfg.arch = dict(embed_dims=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1])
    bb = MODELS.build(bcfg).eval()
    with torch.no_grad():
        outs = bb(torch.zeros(1, 3, 97, 131))
    est = quadratic_attention_estimates(bb, (97, 131))
    assert [e['attention'] for e in est] == [attn] * 4
    assert [tuple(e['grid']) for e in est] == [tuple(o.shape[2:]) for o in outs]


def test_quadratic_warning_only_where_it_does_not_fit(tmp_path):
    from mmseg.registry import MODELS

    paper = load_highres_config(tiny_config(tmp_path, 'ca_pvt_t_fpn_80k_ade20k.py'))
    paper.model.backbone.init_cfg = None
    bb = MODELS.build(paper.model.backbone)
    assert bb.stage_attentions == ('circulant', 'circulant', 'sra', 'sra')
    est = quadratic_attention_estimates(bb, (4096, 4096))
    # stage 3: 256 x 256 tokens, sr 2 -> 128 x 128 keys, 1 head, scores + softmax
    assert est[0]['stage'] == 3 and est[0]['queries'] == 65536 and est[0]['keys'] == 16384
    assert est[0]['bytes'] == 2 * 4 * 65536 * 16384
    assert quadratic_warning(bb, (97, 131)) is None
    warn = quadratic_warning(bb, (8192, 8192))
    assert warn.startswith('WARNING:') and 'quadratic' in warn and 'stage 3' in warn
    assert '\n' not in warn
    allcirc = load_highres_config(tiny_config(tmp_path))
    allcirc.model.backbone.init_cfg = None
    assert quadratic_warning(MODELS.build(allcirc.model.backbone), (8192, 8192)) is None


def test_isotropic_models_have_no_attention_matrix(tmp_path):
    """VECA (O(N C')): no estimate and no warning even at 16k x 16k."""
    model = build_model(load_highres_config(isotropic_config(tmp_path, VECA)), init_weights=False)
    assert quadratic_attention_estimates(model.backbone, (4096, 4096)) == []
    assert quadratic_warning(model.backbone, (16384, 16384)) is None


def test_memory_budget_is_positive_and_named():
    budget, what = memory_budget()
    assert budget > 0 and what in ('available RAM', 'RLIMIT_AS headroom', 'unknown')
