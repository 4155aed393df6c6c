"""tools/deployment/gpu_checks.sh rehearsed on the CPU (``--device cpu``: tiny sizes, this
environment's OpenMMLab, no mmcv build): every step runs and writes its results, so the
lent GPU's minutes go to measuring. One rehearsal (module fixture), then one test per
step's results; what only a GPU can check (CUDA kernels, the mmcv CUDA build, timings)
is in the script's own summary as 'not rehearsed'."""

import glob
import json
import os.path as osp
import tarfile

import pytest

from helpers import run_tool

SCRIPT = 'tools/deployment/gpu_checks.sh'


@pytest.fixture(scope='module')
def rehearsal(tmp_path_factory):
    root = tmp_path_factory.mktemp('gpu_checks')
    out, pack = root / 'out', root / 'back' / 'gpu_checks.tar.gz'
    pack.parent.mkdir()
    proc = run_tool(
        [SCRIPT, '--device', 'cpu', '--out', str(out), '--pack', str(pack)],
        cwd=root,
        timeout=600,
        check=False,
    )
    return proc, out, pack


def _rows(out):
    """summary.md's table: step -> status."""
    rows = {}
    for line in (out / 'summary.md').read_text().splitlines():
        cells = [c.strip() for c in line.strip('|').split('|')]
        if line.startswith('| ') and len(cells) == 4 and cells[0] not in ('step', '---'):
            rows[cells[0]] = cells[1]
    return rows


def _json(path):
    with open(path) as f:
        return json.load(f)


def test_every_step_runs_and_the_exit_status_counts_failures(rehearsal):
    proc, out, _ = rehearsal
    rows = _rows(out)
    steps = ['a_test_cuda', 'b_cadeit', 'e_kernel', 'c_backbones', 'd1_retinanet_train']
    steps += ['d2_retinanet_test', 'd3_mask_rcnn_step', 'd4_compile_train']
    assert list(rows)[: 1 + len(steps)] == ['build_mmcv', *steps], rows
    assert rows['build_mmcv'] == 'not rehearsed'
    failed = [s for s, status in rows.items() if s != 'build_mmcv' and status != 'ok']
    assert proc.returncode == len(failed), (proc.returncode, rows)
    assert not failed, f'{rows}\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}'


def test_step_a_runs_the_cuda_tests(rehearsal):
    log = (rehearsal[1] / 'a_test_cuda.log').read_text()
    # on the CPU every test is skipped, with the reason (not silently)
    assert 'skipped' in log and 'needs a CUDA device' in log, log[-2000:]


def test_step_b_times_both_models_in_both_modes(rehearsal):
    (path,) = glob.glob(str(rehearsal[1] / 'b_cadeit' / '**' / 'results_cpu.json'), recursive=True)
    text = json.dumps(_json(path))
    for word in ('deit_t', 'ca_deit_t', 'eager', 'compile', 'bf16', 'fp32'):
        assert word in text, f'{word} missing from {path}'


def test_step_e_times_and_checks_the_kernel_beside_fft_and_sdpa(rehearsal):
    results = _json(rehearsal[1] / 'e_kernel' / 'results_cpu.json')['results']
    layers = ('sdpa', 'fft', 'kernel-ieee', 'kernel-tf32')
    assert set(results) == {f'{n}|4|{mode}' for n in layers for mode in ('fwd', 'fwd+bwd')}
    assert all(r['status'] == 'ok' and r['time_ms'] > 0 for r in results.values()), results
    errors = {n for n in layers if 'rel_error' in results[f'{n}|4|fwd']}
    assert errors == {'fft', 'kernel-ieee', 'kernel-tf32'}, results


def test_step_c_measures_the_backbone_under_bf16(rehearsal):
    (path,) = glob.glob(
        str(rehearsal[1] / 'c_backbones' / '**' / 'results_cpu.json'), recursive=True
    )
    results = _json(path)['results']
    assert results['ca_swin_t|64x64|1|bf16|eager']['status'] == 'ok', results


def test_step_d_trains_tests_and_steps_the_detectors(rehearsal):
    d = rehearsal[1] / 'd_detectors'
    assert (d / 'retinanet' / 'iter_2.pth').is_file()
    (metrics,) = glob.glob(str(d / 'retinanet_test' / '*' / '*.json'))
    assert 'coco/bbox_mAP' in _json(metrics)
    (scalars,) = glob.glob(str(d / 'mask_rcnn' / '*' / 'vis_data' / 'scalars.json'))
    rows = [json.loads(line) for line in open(scalars) if line.strip()]
    assert any('loss_mask' in r for r in rows), rows
    summary = (rehearsal[1] / 'summary.md').read_text()
    assert '- toy RetinaNet test: coco/bbox_mAP = ' in summary


def test_step_d_times_the_compiled_training_step_against_eager(rehearsal):
    results = _json(rehearsal[1] / 'd_detectors' / 'compile_train' / 'results.json')['results']
    assert set(results) == {'det|eager', 'det|compiled'}, results
    for r in results.values():
        assert r['status'] == 'ok' and len(r['iterations']) == 2, r
    assert (
        results['det|compiled']['graphs_first'] >= 1 and results['det|eager']['graphs_first'] == 0
    )


def test_results_are_packed_for_the_trip_back(rehearsal):
    _, out, pack = rehearsal
    with tarfile.open(pack) as tar:
        names = {osp.normpath(n) for n in tar.getnames()}
    assert {'summary.md', 'a_test_cuda.log', 'd3_mask_rcnn_step.log'} <= names, names
    assert not any(n.endswith('.pth') for n in names), 'checkpoints travel back'
    assert (pack.parent / 'summary.md').read_text() == (out / 'summary.md').read_text()


@pytest.mark.parametrize(
    'args, message',
    [
        (['--device', 'tpu'], '--device must be cuda or cpu'),
        (['--steps', 'a,f'], '--steps takes letters a-e'),
        (['--bogus'], 'unknown argument --bogus'),
    ],
)
def test_bad_arguments_are_one_error_line(tmp_path, args, message):
    proc = run_tool([SCRIPT, *args], cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith('error: ') and message in proc.stderr
