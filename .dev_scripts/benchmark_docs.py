"""Repository upkeep: the documentation's benchmark tables, the model zoo's tables and the
metafiles, written between their markers.

    python .dev_scripts/benchmark_docs.py --headline README.md     # every table
    python .dev_scripts/benchmark_docs.py --tables backbones       # one of them
    python .dev_scripts/benchmark_docs.py --no-run                 # from OUT_DIR's stores

Each measured table (``docs_tables.TABLES``) runs its suite
(``python -m mmcirc.benchmark SUITE``) into ``OUT_DIR/<table>`` and is written, with its
command and machine, between its markers in ``--doc`` (the backbone table's short form
between the ``headline`` markers of ``--headline``). The stored tables
(``docs_stored.STORED``) are rendered from their results files under ``--root`` into
every document that holds them (``zoo``: counted first by ``tools/analysis/get_flops.py``,
not with ``--no-run``; then the metafiles). The markers are checked before anything runs.
A bad flag or input is one ``error:`` line, exit 1.
"""

import os
import os.path as osp
import shlex
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # the sibling modules
sys.path.insert(1, osp.dirname(osp.dirname(osp.abspath(__file__))))  # mmcirc, uninstalled

import docs_metafiles  # noqa: E402
import docs_stored  # noqa: E402
import docs_tables as docs  # noqa: E402

from mmcirc.benchmark.cases import group  # noqa: E402
from mmcirc.benchmark.command import Parser, dispatch  # noqa: E402
from mmcirc.benchmark.grid import parse_hw  # noqa: E402
from mmcirc.cli_errors import main_guard  # noqa: E402
from mmcirc.utils.fileio import atomic_write  # noqa: E402

COMMAND = 'command.txt'  # beside each table's store: the suite command that filled it


def build_parser():
    p = Parser(prog='python .dev_scripts/benchmark_docs.py', description=__doc__.split('\n\n')[0])
    tables = list(docs.TABLES) + list(docs_stored.STORED)
    p.add_argument('--doc', default=osp.join('docs', 'benchmarks.md'), help='markdown file')
    p.add_argument('--headline', help="the README's short table (default: OUT_DIR/headline.md)")
    p.add_argument('--tables', nargs='+', default=tables, choices=tables, metavar='TABLE',
                   help=f'from {tables}')  # fmt: skip
    p.add_argument('--root', default='.', help='repository root (the stored tables)')
    p.add_argument('--sizes', nargs='+', type=int, default=list(docs.BACKBONE_SIZES),
                   help='sides of the backbone tables')  # fmt: skip
    p.add_argument('--models', nargs='+', default=list(docs.BACKBONE_MODELS),
                   choices=group('backbone'), metavar='MODEL')  # fmt: skip
    p.add_argument('--no-run', action='store_true', help='render the stores in OUT_DIR only')
    p.add_argument('--out-dir', default=osp.join('work_dirs', 'benchmark_docs'))
    return p


def write_stored(root: str, names) -> None:
    """Render the stored tables ``names`` into every document under ``root`` that holds
    them; a table no document holds is one ``ValueError``, before anything is written."""
    texts = {}
    for rel in docs_stored.DOCUMENTS:
        path = osp.join(root, rel)
        if osp.isfile(path):
            with open(path) as f:
                texts[path] = f.read()
    missing = [n for n in names if not any(n in docs_stored.held(t) for t in texts.values())]
    if missing:
        raise ValueError(
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


def _read(path, what):
    if not osp.isfile(path):
        raise ValueError(f'{what}: no file {path}')
    with open(path) as f:
        return f.read()


@main_guard
def main(argv=None) -> None:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    for side in args.sizes:  # multiples of the backbones' total stride
        parse_hw(side, '--sizes', 32)
    stored = [t for t in args.tables if t in docs_stored.STORED]
    tables = [t for t in args.tables if t in docs.TABLES]
    if 'zoo' in stored and not args.no_run:
        docs_metafiles.count_zoo(args.root)
    if stored:
        write_stored(args.root, stored)
    if 'zoo' in stored:
        docs_metafiles.write_metafiles(args.root)
    if not tables:
        return
    headline = args.headline or osp.join(args.out_dir, 'headline.md')
    text = _read(args.doc, '--doc')
    docs.check_markers(text, tables, args.doc)
    head_text = None
    if 'backbones' in tables and osp.exists(headline):
        head_text = _read(headline, '--headline')
        docs.check_markers(head_text, [docs.HEADLINE], headline)

    blocks, backbone_block = {}, None
    for name in tables:
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
            argv = [table.suite, *argv, '--out-dir', out]
            print(f'[docs] {name}: python -m mmcirc.benchmark {table.suite} ...', flush=True)
            dispatch(argv)
            command = shlex.join(['python', '-m', 'mmcirc.benchmark', *argv])
            atomic_write(osp.join(out, COMMAND), command + '\n')
        command = _read(osp.join(out, COMMAND), f'{name} (run it without --no-run)').strip()
        store = docs.load_store(osp.join(out, table.results))
        env = store.get('environment')
        blocks[name] = docs.block(command, table.render(store), env)
        if name == 'backbones':
            backbone_block = docs.block(command, docs.render_headline(store), env)

    atomic_write(args.doc, docs.replace_blocks(text, blocks, args.doc))
    print(f'[docs] wrote {", ".join(tables)} into {args.doc}')
    if backbone_block is not None:
        if head_text is None:
            head_text = f'{docs.marker(docs.HEADLINE)}\n{docs.END_MARKER}\n'
        new = docs.replace_blocks(head_text, {docs.HEADLINE: backbone_block}, headline)
        atomic_write(headline, new)
        print(f'[docs] wrote {docs.HEADLINE} into {headline}')


if __name__ == '__main__':
    main()
