"""``python .dev_scripts/benchmark_docs.py`` on the tables kept in results files: each is
written from its file into every document that holds its markers, nothing outside the
markers changes, a table no document holds is one ``error:`` line, and the zoo's file
gives the metafiles and the model index."""

import json
import os.path as osp
import shutil

import pytest
import yaml

import docs_stored
import docs_tables as docs
from helpers import REPO


@pytest.fixture
def run_docs(capsys):
    from benchmark_docs import main

    def run(*args):
        capsys.readouterr()
        try:
            main(list(map(str, args)))
            rc = 0
        except SystemExit as err:
            rc = err.code
        return rc, capsys.readouterr().err

    return run


def _between(text, name):
    start = text.index(docs.marker(name)) + len(docs.marker(name))
    return text[start : text.index(docs.END_MARKER, start)]


def _root(tmp_path, readme, benchmarks='# Benchmarks\n'):
    (tmp_path / 'docs' / 'results').mkdir(parents=True)
    shutil.copy(osp.join(REPO, 'docs', 'results', 'toy_job.json'), tmp_path / 'docs' / 'results')
    (tmp_path / 'README.md').write_text(readme)
    (tmp_path / 'docs' / 'benchmarks.md').write_text(benchmarks)
    return tmp_path


def test_a_stored_table_goes_into_every_document_that_holds_it(tmp_path, run_docs):
    readme = f'# x\n\nbefore\n\n{docs.marker("toy")}\nold\n{docs.END_MARKER}\n\nafter\n'
    bench = f'# b\n\n{docs.marker("toy_runs")}\n{docs.END_MARKER}\n'
    root = _root(tmp_path, readme, bench)
    assert run_docs('--tables', 'toy', 'toy_runs', '--root', root) == (0, '')
    store = docs_stored.load(str(root / 'docs' / 'results' / 'toy_job.json'))
    text = (root / 'README.md').read_text()
    assert _between(text, 'toy').strip() == docs_stored.render_toy(store).strip()
    assert text.startswith('# x\n\nbefore\n\n') and text.endswith('\n\nafter\n')
    runs = _between((root / 'docs' / 'benchmarks.md').read_text(), 'toy_runs')
    assert all(run['det']['bbox mAP'] in runs for run in store['runs'])

    store['runs'][0]['seg']['mIoU'] = '11.11'  # below every other run: the spread's low end
    (root / 'docs' / 'results' / 'toy_job.json').write_text(json.dumps(store))
    assert run_docs('--tables', 'toy', '--root', root)[0] == 0
    assert '**mIoU 11.11-' in (root / 'README.md').read_text()


def test_a_stored_table_no_document_holds_is_one_error_line(tmp_path, run_docs):
    root = _root(tmp_path, '# x\n')
    rc, err = run_docs('--tables', 'toy', '--root', root)
    assert rc == 1 and err.startswith('error: ') and err.count('\n') == 1, err
    assert "'<!-- generated: toy -->'" in err
    assert (root / 'README.md').read_text() == '# x\n'


def test_the_zoo_file_gives_the_table_the_metafiles_and_the_index(tmp_path, run_docs):
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs' / 'README.md').write_text(
        f'# zoo\n\n{docs.marker("zoo")}\n{docs.END_MARKER}\n'
    )
    (tmp_path / 'docs' / 'results').mkdir(parents=True)
    one = dict(scope='mmdet', backbone='CA-PVT-S', model='RetinaNet', schedule='12 epochs')
    store = dict(
        command='get_flops.py CONFIG',
        environment=dict(date='2000-01-01', torch='t', mmcv='m'),
        configs={
            'ca_pvt_s_retinanet_coco.py': dict(one, family='ca_pvt', params=123456, flops=7e9),
            'veca_b_linear_40k_ade20k.py': dict(
                scope='mmseg',
                family='veca',
                backbone='VECA-B',
                model='linear probe',
                schedule='40k iterations',
                params=654321,
                flops=8e9,
            ),
        },
    )
    (tmp_path / 'docs' / 'results' / 'model_zoo.json').write_text(json.dumps(store))
    assert run_docs('--tables', 'zoo', '--no-run', '--root', tmp_path)[0] == 0
    table = _between((tmp_path / 'configs' / 'README.md').read_text(), 'zoo')
    assert '| CA-PVT-S | RetinaNet | 12 epochs | 0.12 | 7.00 | not trained |' in table
    index = yaml.safe_load((tmp_path / 'model-index.yml').read_text())
    assert sorted(index['Import']) == ['configs/ca_pvt/metafile.yml', 'configs/veca/metafile.yml']
    meta = yaml.safe_load((tmp_path / 'configs' / 'veca' / 'metafile.yml').read_text())
    (model,) = meta['Models']
    assert model['Config'] == 'configs/veca_b_linear_40k_ade20k.py'
    assert model['Metadata']['Parameters'] == 654321 and model['Results'] == []
    assert model['In Collection'] == meta['Collections'][0]['Name']
