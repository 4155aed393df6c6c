"""The command that regenerates the documentation's benchmark tables
(``python -m mmcirc.benchmark docs``, ``tools/analysis/benchmark_docs.py``): it runs the
suite of each table (:data:`mmcirc.benchmark.docs.TABLES`) into ``OUT_DIR/<table>``,
renders each table from its suite's store and writes it, with its command and machine,
between the table's markers in ``--doc`` (``<!-- generated: NAME -->`` ...
``<!-- end -->``); the backbone table's short form goes between the ``headline`` markers
of ``--headline`` (a new file with those markers where it does not exist). The markers are
checked before anything runs; a missing one is one ``error:`` line and nothing is written.
"""

import argparse
import importlib
import os
import os.path as osp
import shlex

from mmcirc.benchmark import docs
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
        default=list(docs.TABLES),
        choices=list(docs.TABLES),
        metavar='TABLE',
        help=f'the tables to regenerate, from {list(docs.TABLES)} (default: all)',
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


@main_guard
def main(argv=None):
    args = parse_args(argv)
    check_stride_sizes(args.sizes)
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
