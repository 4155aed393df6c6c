"""The command that regenerates the documentation's benchmark tables
(``python -m mmcirc.benchmark docs``, ``tools/analysis/benchmark_docs.py``): it runs the
suite of each table (:data:`mmcirc.benchmark.docs.TABLES`) into ``OUT_DIR/<table>``,
renders each table from its suite's store and writes it, with its command and machine,
between the table's markers in ``--doc`` (``<!-- generated: NAME -->`` ...
``<!-- end -->``); the backbone table's short form goes between the ``headline`` markers
of ``--headline`` (a new file with those markers where it does not exist). The markers are
checked before anything runs; a missing one is one ``error:`` line and nothing is written.

The tables whose results file is kept in the repository
(:data:`mmcirc.benchmark.docs_stored.STORED`: the GPU, the main job, the model zoo) are
rendered from their file under ``--root`` into every document of
:data:`~mmcirc.benchmark.docs_stored.DOCUMENTS` that holds their markers. Of them only
``zoo`` measures: ``tools/analysis/get_flops.py`` on every config (toy configs aside) into
``docs/results/model_zoo.json`` (not with ``--no-run``), from which the metafiles and
``model-index.yml`` are written too (:mod:`mmcirc.benchmark.docs_zoo`).
"""

import argparse
import importlib
import os
import os.path as osp
import shlex

from mmcirc.benchmark import docs, docs_stored, docs_zoo
from mmcirc.cli.common import CLIError, check_stride_sizes, main_guard
from mmcirc.utils.fileio import atomic_write

COMMAND = 'command.txt'  # beside each table's store: the suite command that filled it


def parse_args(argv=None):
    from mmcirc.benchmark.cases import group

    p = argparse.ArgumentParser(description=__doc__.split('\n')[0].strip())
    p.add_argument('--doc', default=osp.join('docs', 'benchmarks.md'), help='markdown file')
    p.add_argument(
        '--headline',
        default=None,
        help="file with the README's short table between its headline markers "
        '(default: OUT_DIR/headline.md, written new)',
    )
    p.add_argument(
        '--tables',
        nargs='+',
        default=list(docs.TABLES) + list(docs_stored.STORED),
        choices=list(docs.TABLES) + list(docs_stored.STORED),
        metavar='TABLE',
        help=f'the tables to regenerate, from {list(docs.TABLES)} (measured) and '
        f'{list(docs_stored.STORED)} (from their results files; default: all)',
    )
    p.add_argument(
        '--root',
        default='.',
        help='repository root: the results files and documents of the stored tables',
    )
    p.add_argument(
        '--sizes',
        nargs='+',
        type=int,
        default=list(docs.BACKBONE_SIZES),
        help='input sides of the backbone tables (multiples of 32)',
    )
    p.add_argument(
        '--models',
        nargs='+',
        default=list(docs.BACKBONE_MODELS),
        choices=group('backbone'),
        metavar='MODEL',
        help=f'models of the backbone tables, from {group("backbone")}',
    )
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_docs'))
    p.add_argument(
        '--no-run',
        action='store_true',
        help='render from the stores an earlier run left in OUT_DIR, measure nothing',
    )
    return p.parse_args(argv)


def _read(path, what):
    if not osp.isfile(path):
        raise CLIError(f'{what}: no file {path}')
    with open(path) as f:
        return f.read()


def count_zoo(root):
    """``tools/analysis/get_flops.py CONFIG --mode backbone --shape 224 224`` on every
    config under ``root/configs`` (``toy/`` aside), into ``docs/results/model_zoo.json``."""
    import datetime
    import importlib.util
    import json
    import tempfile

    import mmcv
    import torch
    from mmengine.config import Config

    spec = importlib.util.spec_from_file_location(
        'get_flops', osp.join(root, 'tools', 'analysis', 'get_flops.py')
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    names = sorted(n for n in os.listdir(osp.join(root, 'configs')) if n.endswith('.py'))
    configs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = osp.join(root, 'configs', name)
            out = osp.join(tmp, name + '.json')
            argv = docs_zoo.ZOO_COMMAND.split()[2:]
            argv[argv.index('CONFIG')] = path
            print(f'[docs] zoo: get_flops.py {name}', flush=True)
            tool.main([*argv, '--out-json', out])
            with open(out) as f:
                counted = json.load(f)
            configs[name] = dict(
                docs_zoo.describe(name, Config.fromfile(path)),
                params=int(counted['params']),
                flops=int(counted['flops']),
                mode=counted['mode'],
            )
    store = dict(
        command=docs_zoo.ZOO_COMMAND,
        environment=dict(
            date=datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d'),
            torch=torch.__version__,
            mmcv=mmcv.__version__,
        ),
        configs=configs,
    )
    text = json.dumps(store, indent=1, sort_keys=True)
    atomic_write(osp.join(root, docs_zoo.ZOO_RESULTS), text + '\n')


def write_stored(root, names):
    """Render the stored tables ``names`` into every document under ``root`` that holds
    them; a table no document holds is one ``error:`` line, before anything is written."""
    texts = {}
    for rel in docs_stored.DOCUMENTS:
        path = osp.join(root, rel)
        if osp.isfile(path):
            texts[path] = _read(path, 'document')
    missing = [n for n in names if not any(n in docs_stored.held(t) for t in texts.values())]
    if missing:
        raise CLIError(
            f'no document under {root} holds {docs.marker(missing[0])!r} '
            f'(documents: {", ".join(docs_stored.DOCUMENTS)})'
        )
    for path, text in texts.items():
        new = docs_stored.render_document(text, root, names, path)
        if new != text:
            atomic_write(path, new)
        shown = [n for n in names if n in docs_stored.held(text)]
        if shown:
            print(f'[docs] wrote {", ".join(shown)} into {path}')


@main_guard
def main(argv=None):
    args = parse_args(argv)
    check_stride_sizes(args.sizes)
    stored = [t for t in args.tables if t in docs_stored.STORED]
    args.tables = [t for t in args.tables if t in docs.TABLES]
    if 'zoo' in stored and not args.no_run:
        count_zoo(args.root)
    if stored:
        write_stored(args.root, stored)
    if 'zoo' in stored:
        store = docs_stored.load(osp.join(args.root, docs_zoo.ZOO_RESULTS))
        for rel, text in docs_zoo.metafiles(store).items():
            os.makedirs(osp.dirname(osp.join(args.root, rel)) or '.', exist_ok=True)
            atomic_write(osp.join(args.root, rel), text)
        print(f'[docs] wrote the metafiles and model-index.yml under {args.root}')
    if not args.tables:
        return
    headline = args.headline or osp.join(args.out_dir, 'headline.md')
    text = _read(args.doc, '--doc')
    docs.check_markers(text, args.tables, args.doc)
    head_text = None
    if 'backbones' in args.tables and osp.exists(headline):
        head_text = _read(headline, '--headline')
        docs.check_markers(head_text, [docs.HEADLINE], headline)

    blocks, backbone_block = {}, None
    for name in args.tables:
        table = docs.TABLES[name]
        out = osp.join(args.out_dir, name)
        if not args.no_run:
            os.makedirs(out, exist_ok=True)
            for stale in (table.results, COMMAND):
                if osp.exists(osp.join(out, stale)):
                    os.remove(osp.join(out, stale))
            argv = list(
                docs.backbone_argv(args.models, args.sizes) if name == 'backbones' else table.argv
            )
            argv += ['--out-dir', out]
            print(f'[docs] {name}: python -m mmcirc.benchmark {table.suite} ...', flush=True)
            importlib.import_module(f'mmcirc.cli.benchmark_{table.suite}').main(argv)
            command = shlex.join(['python', '-m', 'mmcirc.benchmark', table.suite, *argv])
            atomic_write(osp.join(out, COMMAND), command + '\n')
        command = _read(osp.join(out, COMMAND), f'{name} (run it without --no-run)').strip()
        store = docs.load_store(osp.join(out, table.results))
        env = store.get('environment')
        blocks[name] = docs.block(command, table.render(store), env)
        if name == 'backbones':
            backbone_block = docs.block(command, docs.render_headline(store), env)

    atomic_write(args.doc, docs.replace_blocks(text, blocks, args.doc))
    print(f'[docs] wrote {", ".join(args.tables)} into {args.doc}')
    if backbone_block is not None:
        if head_text is None:
            head_text = f'{docs.marker(docs.HEADLINE)}\n{docs.END_MARKER}\n'
        new = docs.replace_blocks(head_text, {docs.HEADLINE: backbone_block}, headline)
        atomic_write(headline, new)
        print(f'[docs] wrote {docs.HEADLINE} into {headline}')
