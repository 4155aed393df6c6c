"""tools/model_converters/*_to_mmcirc.py from the command line (fake checkpoints of
tests/checkpoint_fakes.py): the PVT and Swin tools through a fresh process each, the
CA-DeiT one and the error cases through the package's ``main`` in this process (same
code, no second start-up)."""

import re

import pytest
import torch

import checkpoint_fakes as fakes
from helpers import run_tool
from mmcirc.cli.convert import cadeit_main, pvt_main, swin_main


def _load(path):
    from mmcirc.engine import load_from_local

    return load_from_local(str(path), map_location=None)


def test_pvt_cli_default_output(tmp_path):
    src = fakes.official_pvt()
    torch.save(src, tmp_path / 'pvt_fake.pth')  # the whai362 files are bare state dicts
    proc = run_tool(
        ['tools/model_converters/pvt_to_mmcirc.py', 'pvt_fake.pth', '--arch', repr(fakes.PVT_ARCH)],
        cwd=tmp_path,
    )
    out = tmp_path / 'work_dirs' / 'pretrained' / 'ca_pvt_custom_in1k.pth'
    assert 'saved work_dirs/pretrained/ca_pvt_custom_in1k.pth' in proc.stdout
    assert (
        'PVT (official layout) -> CAPVT' in proc.stdout and 'unused from the source' in proc.stdout
    )
    ckpt = _load(out)
    assert ckpt['meta']['source'] == 'pvt_fake.pth' and ckpt['meta']['source_layout'] == 'official'
    assert torch.equal(
        ckpt['state_dict']['layers.3.blocks.0.attn.attn.out_proj.weight'],
        src['block4.0.attn.proj.weight'],
    )
    assert not any(k.startswith('backbone.') for k in ckpt['state_dict'])


def test_swin_then_cadeit_cli(tmp_path, run_main):
    torch.save({'model': fakes.official_swin()}, tmp_path / 'swin.pth')
    cadeit = fakes.official_cadeit(width=16, depth=2)
    torch.save(cadeit, tmp_path / 'ca_deit.pth')
    arch = repr(fakes.SWIN_ARCH)
    run_tool(
        [
            'tools/model_converters/swin_to_mmcirc.py',
            'swin.pth',
            'base.pth',
            '--arch',
            arch,
            '--backbone-options',
            'window_size=7',
        ],
        cwd=tmp_path,
    )
    proc = run_main(
        cadeit_main,
        [
            'ca_deit.pth',
            'out.pth',
            '--arch',
            arch,
            '--base',
            'base.pth',
            '--source-blocks',
            '1',
            '0',
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert 'CA-DeiT (width 16, blocks [1, 0]: 30 tensors) -> CASwin' in proc.stdout
    base, out = _load(tmp_path / 'base.pth'), _load(tmp_path / 'out.pth')
    assert torch.equal(
        out['state_dict']['stages.1.blocks.0.attn.gate.0.weight'],
        cadeit['model']['blocks.1.attn.gate.0.weight'],
    )
    assert torch.equal(
        out['state_dict']['stages.2.blocks.1.attn.w_msa.relative_position_bias_table'],
        base['state_dict']['stages.2.blocks.1.attn.w_msa.relative_position_bias_table'],
    )
    assert out['meta']['cadeit_blocks'] == [1, 0]
    assert not any(k.startswith('stages.1.') for k in out['meta']['new'])


def test_cli_errors(tmp_path, run_main):
    proc = run_main(swin_main, ['missing.pth'], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == 'error: checkpoint not found: missing.pth'

    torch.save(fakes.official_pvt(), tmp_path / 'pvt_fake.pth')
    proc = run_main(
        pvt_main,
        [
            'pvt_fake.pth',
            'x.pth',
            '--arch',
            repr(dict(fakes.PVT_ARCH, embed_dims=(16, 32, 40, 64))),
        ],
        tmp_path,
    )
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert (
        'layers.0.patch_embed.projection.weight: checkpoint (8, 3, 4, 4) vs model (16, 3, 4, 4)'
        in proc.stderr
    )
    # the tensor list and the hint on the one error line
    (line,) = proc.stderr.strip().splitlines()
    assert re.match(r'error: \d+ tensor\(s\) of the checkpoint do not fit CAPVT\(', line) and (
        'the checkpoint has depths (1, 2, 1, 1) and widths (8, 16, 40, 64)' in line
    )
    assert not (tmp_path / 'x.pth').exists()


@pytest.mark.parametrize(
    'main,args,text',
    [
        (
            cadeit_main,
            ['src.pth', 'x.pth', '--family', 'deit', '--base', 'src.pth', '--attention', 'core'],
            'error: --base, --attention do not apply to --family deit',
        ),
        (
            pvt_main,
            ['src.pth', 'x.pth', '--backbone-options', 'nokey'],
            'error: --backbone-options takes key=value',
        ),
        (
            pvt_main,
            ['src.pth', 'x.pth', '--pos-embed-size', '0'],
            'error: pos_embed_size must be a positive int',
        ),
        (
            swin_main,
            ['src.pth', 'x.pth', '--arch', 'huge'],
            'error: cannot build the target CASwin',
        ),
        (
            cadeit_main,
            ['src.pth', 'x.pth', '--base', 'missing.pth'],
            'error: checkpoint not found: missing.pth',
        ),
    ],
)
def test_cli_option_errors_are_one_line(tmp_path, run_main, main, args, text):
    torch.save(fakes.official_pvt(), tmp_path / 'src.pth')
    proc = run_main(main, args, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(text), proc.stderr
    assert not (tmp_path / 'x.pth').exists()


def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, run_main):
    torch.save(fakes.official_pvt(), tmp_path / 'pvt.pth')
    before = (tmp_path / 'pvt.pth').read_bytes()
    proc = run_main(pvt_main, ['pvt.pth', './pvt.pth', '--arch', repr(fakes.PVT_ARCH)], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        'error: OUT ./pvt.pth is the input pvt.pth: name another output file'
    ]
    assert (tmp_path / 'pvt.pth').read_bytes() == before


def test_default_outputs_are_named_by_the_backbone_options(tmp_path, run_main):
    torch.save(fakes.official_pvt(), tmp_path / 'pvt.pth')
    args = ['pvt.pth', '--arch', repr(fakes.PVT_ARCH), '--attention', 'core']
    first = run_main(pvt_main, args, tmp_path)
    second = run_main(pvt_main, [*args, '--backbone-options', 'num_cores_max=32'], tmp_path)
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    saved = [ln.split()[-1] for p in (first, second) for ln in p.stdout.splitlines()
             if ln.startswith('saved ')]  # fmt: skip
    assert saved == [
        'work_dirs/pretrained/core_pvt_custom_in1k.pth',
        'work_dirs/pretrained/core_pvt_custom_num_cores_max-32_in1k.pth',
    ]
    metas = [_load(tmp_path / p)['meta']['backbone_options'] for p in saved]
    assert metas == [{}, {'num_cores_max': '32'}]


def test_an_existing_default_output_is_overwritten_only_with_force(tmp_path, run_main):
    torch.save(fakes.official_pvt(), tmp_path / 'pvt.pth')
    out = tmp_path / 'work_dirs' / 'pretrained' / 'ca_pvt_custom_in1k.pth'
    out.parent.mkdir(parents=True)
    out.write_bytes(b'an earlier conversion')
    args = ['pvt.pth', '--arch', repr(fakes.PVT_ARCH)]
    proc = run_main(pvt_main, args, tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert 'ca_pvt_custom_in1k.pth exists' in proc.stderr and '--force' in proc.stderr
    assert out.read_bytes() == b'an earlier conversion'
    assert run_main(pvt_main, [*args, '--force'], tmp_path).returncode == 0
    assert 'state_dict' in _load(out)


@pytest.mark.parametrize('content', [b'weights: see the README\n', b''], ids=['text', 'empty'])
def test_a_source_that_is_no_checkpoint_is_one_line(tmp_path, run_main, content):
    (tmp_path / 'notes.pth').write_bytes(content)
    proc = run_main(swin_main, ['notes.pth', 'x.pth'], tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and 'notes.pth' in lines[0], proc.stderr
    assert not (tmp_path / 'x.pth').exists()
