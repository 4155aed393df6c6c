"""A forward a reader can follow: one eager forward of a built pyramid runs only the
modules' own calls, few functions in few files (counted with ``sys.setprofile``,
qualified names, over the mmcirc package), and building one scans no registry."""

import os
import sys

import pytest
import torch

import mmcirc
from mmcirc.models.backbones import CAPVT, CASwin, pyramid_build

PACKAGE = os.path.dirname(mmcirc.__file__) + os.sep
# the backbone, its blocks, the attention op, its transforms and the switches (the plan a
# layer keeps is kept under the settings of mmcirc.ops.settings)
MAX_FUNCTIONS, MAX_FILES = 22, 5


def mmcirc_calls(model, x):
    """{(file, qualified name)} of the mmcirc functions one forward calls (after a first
    forward: what a forward of this shape decides once is made then)."""
    seen = set()

    def profile(frame, event, arg):
        code = frame.f_code
        if event == 'call' and code.co_filename.startswith(PACKAGE):
            seen.add((code.co_filename[len(PACKAGE) :], code.co_qualname))

    with torch.no_grad():
        model(x)
        sys.setprofile(profile)
        try:
            model(x)
        finally:
            sys.setprofile(None)
    return seen


@pytest.mark.parametrize(
    'build',
    [
        lambda: CAPVT(arch='small', stage_attentions='circulant'),
        lambda: CASwin(arch='tiny'),
    ],
    ids=['all-circulant CA-PVT-S', 'CA-Swin-T'],
)
def test_one_forward_calls_few_functions_in_few_files(build):
    calls = mmcirc_calls(build().eval(), torch.randn(1, 3, 64, 64))
    files = {f for f, _ in calls}
    assert len(calls) <= MAX_FUNCTIONS, sorted(calls)
    assert len(files) <= MAX_FILES, sorted(files)
    assert ('ops/circulant.py', 'CirculantAttention.forward') in calls  # the counter sees it


def test_building_from_the_short_form_reads_no_registry(monkeypatch):
    def refuse():
        raise AssertionError('a registry was read while building')

    monkeypatch.setattr(pyramid_build, 'model_registries', refuse)
    CAPVT(arch='tiny', stage_attentions=('circulant', 'core', 'sra', 'sra'))
    CASwin(arch='tiny', attention='core')


def test_a_block_type_is_looked_up_by_name_not_scanned(monkeypatch):
    real = pyramid_build.model_registries()[0]
    asked = []

    class Lookup:  # get and build only: a scan of the registry would fail here
        def get(self, name):
            asked.append(name)
            return real.get(name)

        def build(self, cfg):
            return real.build(cfg)

    monkeypatch.setattr(pyramid_build, 'model_registries', lambda: [Lookup()])
    model = CAPVT(
        arch='tiny', block_cfgs=[dict(type='CirculantBlock', boundary='zero'), None, None, None]
    )
    assert asked == ['CirculantBlock']
    assert model.layers[0].blocks[0].attn.boundary == 'zero'
