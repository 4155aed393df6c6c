"""``python -m mmcirc.benchmark SUITE [ARGS]``: one parser with a subcommand per suite of
:mod:`mmcirc.benchmark.suites` and ``docs`` (the documentation's tables); ``SUITE --help``
lists its flags. A bad flag is one ``error:`` line and exit 1 (``MMCIRC_DEBUG=1``: the
traceback)."""

import argparse
import os
import os.path as osp
import shlex
import sys

from mmcirc.cli_errors import main_guard
from mmcirc.utils.fileio import atomic_write

from . import docs, docs_stored, metafiles
from .cases import group
from .measurement import COMPILE_MODES, PRECISIONS
from .suites import attention, backbone, compile_train, gpu, isotropic, kernel, launches, sharded
from .suites import compile as compile_suite

#: the flags several suites share: dest -> (flag, keywords); each suite gives its default
SHARED = {
    'out_dir': ('--out-dir', dict(help='folder of the results and tables (default: %(default)s)')),
    'threads': ('--threads', dict(type=int, help="torch intra-op threads (default: torch's)")),
    'repeat': ('--repeat', dict(type=int, help='timed runs (default: %(default)s)')),
    'timeout': ('--timeout', dict(type=float, help='seconds per child (default: %(default)s)')),
    'fresh': ('--fresh', dict(action='store_true', help='ignore earlier results in out-dir')),
    'device': ('--device', dict(help="'cpu' or 'cuda' (default: %(default)s; None: cuda if any)")),
}


def parse_hw(text: str, flag: str, multiple: int = 1):
    """A size flag's value, ``S`` (square) or ``HxW``, as (H, W): both >= ``multiple`` and
    multiples of it; anything else is a one-line ``ValueError`` naming ``flag``."""
    try:
        hw = tuple(int(p) for p in str(text).lower().split('x'))
    except ValueError:
        hw = ()
    if len(hw) == 1:
        hw = hw * 2
    if len(hw) != 2 or any(s < multiple or s % multiple for s in hw):
        raise ValueError(
            f'{flag}: each size must be S or HxW with multiples of {multiple} '
            f'(>= {multiple}), got {text!r}'
        )
    return hw


def check_stride_sizes(sizes, flag: str = '--sizes', stride: int = 32) -> None:
    """Square sides of a backbone benchmark: positive multiples of the total ``stride``."""
    bad = [s for s in sizes if s < stride or s % stride]
    if bad:
        raise ValueError(f'{flag} must be multiples of {stride} (the total stride), got {bad}')


def _at_least(args, names, least=1, wording='a positive int'):
    for name in names:
        value = getattr(args, name)
        if value is not None and value < least:
            raise ValueError(f'--{name.replace("_", "-")} must be {wording}, got {value}')


def _above_zero(args, names):
    for name in names:
        if getattr(args, name) <= 0:
            raise ValueError(f'--{name.replace("_", "-")} must be > 0, got {getattr(args, name)}')


def _known(values, allowed, flag):
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f'{flag}: unknown {unknown}; choose from {list(allowed)}')


def _one_of(args, name, allowed):
    if getattr(args, name) not in allowed:
        raise ValueError(f'--{name} must be one of {allowed}, got {getattr(args, name)!r}')


def _device(args, default, missing='CUDA is not available'):
    import torch

    if args.device is None:
        args.device = default or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.device not in ('cuda', 'cpu'):
        raise ValueError(f'--device must be cuda or cpu, got {args.device!r}')
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f'--device cuda: {missing}')


def _command(suite, argv):
    return f'python -m mmcirc.benchmark {suite} ' + ' '.join(argv)


# ------------------------------------------------------------- each suite: checks, run


def run_attention(args, argv):
    _device(args, 'cpu')
    if any(s < 1 for s in args.sizes) or args.repeat < 1:
        raise ValueError(f'--sizes and --repeat must be positive, got {args.sizes}, {args.repeat}')
    return attention.run(args)


def run_backbone(args, argv):
    check_stride_sizes(args.sizes)
    _at_least(args, ['batch'])
    return backbone.run(args)


def run_compile(args, argv):
    _known(args.models, compile_suite.MODELS, '--models')
    _one_of(args, 'backend', compile_suite.BACKENDS)
    _one_of(args, 'mode', compile_suite.MODES)
    _at_least(args, ['repeat', 'threads'])
    args.sizes = [parse_hw(s, '--sizes', compile_suite.MULTIPLE) for s in args.sizes]
    return compile_suite.run(args, _command('compile', argv))


def run_compile_train(args, argv):
    _known(args.jobs, compile_train.JOBS, '--jobs')
    _one_of(args, 'backend', compile_train.BACKENDS)
    _at_least(args, ['iters', 'threads', 'timeout'], wording='a positive number')
    if not 0 <= args.warmup < args.iters:
        raise ValueError(f'--warmup must be in [0, --iters), got {args.warmup}')
    return compile_train.run(args, _command('compile_train', argv))


def run_gpu(args, argv):
    import importlib.util

    _above_zero(args, ['repeat', 'budget_s', 'compile_max_size', 'depth'])
    if any(b < 1 for b in args.batches):
        raise ValueError(f'--batches must be positive ints, got {args.batches}')
    if any(s < gpu.PATCH or s % gpu.PATCH for s in args.sizes):
        raise ValueError(
            f'--sizes must be multiples of the patch size {gpu.PATCH}, got {args.sizes}'
        )
    if importlib.util.find_spec('timm') is None:
        raise ValueError('the gpu suite needs timm (the DeiT / ViT baselines): pip install timm')
    _device(args, None)
    return gpu.run(args)


def run_isotropic(args, argv):
    if args.flops_only and not args.flops:
        raise ValueError('--flops-only and --no-flops exclude each other')
    _known(args.models, isotropic.MODELS, '--models')
    _at_least(args, ['repeat', 'depth', 'threads', 'batch'])
    _above_zero(args, ['single_run_above', 'timeout'])
    args.sizes = [parse_hw(s, '--sizes', isotropic.PATCH) for s in args.sizes]
    return isotropic.run(args, _command('isotropic', argv))


def run_kernel(args, argv):
    _at_least(args, ['batch', 'dim', 'repeat'])
    if any(s < 1 or s > 64 for s in args.sizes):
        raise ValueError(f"--sizes must lie in 1..64 (the kernel's maps), got {args.sizes}")
    _device(args, None, missing='no CUDA device')
    return kernel.run(args, _command('kernel', argv))


def run_launches(args, argv):
    _known(args.models, launches.PAIRS, '--models')
    _at_least(args, ['repeat', 'threads', 'host_size'])
    args.sizes = [parse_hw(s, '--sizes', launches.MULTIPLE) for s in args.sizes]
    if any(h != w for h, w in args.sizes):
        raise ValueError(f'--sizes must be square sizes S, got {args.sizes}')
    if (args.host_size, args.host_size) not in args.sizes:
        raise ValueError(f'--host-size {args.host_size} must be one of --sizes')
    return launches.run(args, _command('launches', argv))


def run_sharded(args, argv):
    if args.size < 32:
        raise ValueError(f'--size must be >= 32, got {args.size}')
    if min(args.nprocs) < 1 or args.threads < 1:
        raise ValueError(f'--nprocs and --threads must be >= 1, got {args.nprocs} {args.threads}')
    for cfg in args.configs:
        if not osp.isfile(cfg):
            raise ValueError(f'config file not found: {cfg}')
    return sharded.run(args)


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
            f'no document under {root} holds {docs_stored.marker(missing[0])!r} '
            f'(documents: {", ".join(docs_stored.DOCUMENTS)})'
        )
    for path, text in texts.items():
        new = docs_stored.render_document(text, root, names, path)
        if new != text:
            atomic_write(path, new)
        shown = [n for n in names if n in docs_stored.held(text)]
        if shown:
            print(f'[docs] wrote {", ".join(shown)} into {path}')


COMMAND = 'command.txt'  # beside each table's store: the suite command that filled it


def _read(path, what):
    if not osp.isfile(path):
        raise ValueError(f'{what}: no file {path}')
    with open(path) as f:
        return f.read()


def run_docs(args, argv) -> None:
    """``docs``: run the suite of each table of ``args.tables`` into ``OUT_DIR/<table>``
    and write the table, with its command and machine, between its markers in ``--doc``
    (the backbone table's short form between the ``headline`` markers of ``--headline``);
    the stored tables from their results files (``zoo`` counted first, not with
    ``--no-run``). The markers are checked before anything runs."""
    check_stride_sizes(args.sizes)
    stored = [t for t in args.tables if t in docs_stored.STORED]
    tables = [t for t in args.tables if t in docs.TABLES]
    if 'zoo' in stored and not args.no_run:
        metafiles.count_zoo(args.root)
    if stored:
        write_stored(args.root, stored)
    if 'zoo' in stored:
        metafiles.write_metafiles(args.root)
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
            atomic_write(
                osp.join(out, COMMAND),
                shlex.join(['python', '-m', 'mmcirc.benchmark', *argv]) + '\n',
            )
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


# ----------------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    """The one parser: a subparser per suite (and ``docs``), each with its flags."""
    parser = argparse.ArgumentParser(
        prog='python -m mmcirc.benchmark', description='Run a benchmark suite (SUITE --help).'
    )
    subs = parser.add_subparsers(dest='suite', metavar='SUITE', required=True)

    def suite(name, module, out_dir=True, doc=None, **shared):
        doc = doc or ' '.join(module.__doc__.split('\n\n')[0].split())  # its first paragraph
        p = subs.add_parser(name, help=doc.split(': ', 1)[-1].split('; ')[0], description=doc)
        if out_dir:
            shared = dict(out_dir=osp.join('work_dirs', f'benchmark_{name}'), **shared)
        for dest, default in shared.items():
            flag, kwargs = SHARED[dest]
            p.add_argument(flag, default=default, **kwargs)
        return p

    def many(p, flag, default, **kwargs):  # a flag of one or more values
        p.add_argument(flag, nargs='+', default=default, **kwargs)

    def models(p, default, allowed, choose=False, also=''):
        choices = dict(choices=allowed) if choose else {}
        many(p, '--models', default, metavar='MODEL', help=f'from {allowed}{also}', **choices)

    p = suite(
        'attention', attention, threads=None, repeat=5, timeout=None, device='cpu', fresh=False
    )
    many(p, '--sizes', [32, 64, 128, 256, 512], type=int, help='map sides H = W')
    p.add_argument(
        '--max-seconds',
        type=float,
        default=attention.MAX_SECONDS_PER_MEASUREMENT,
        help='timed seconds per method and size (at least 2 runs)',
    )
    p.add_argument('--amp', choices=['bf16', 'fp16'], help='under torch.autocast to this dtype')
    p.add_argument('--no-backward', action='store_true', help='forward only')
    many(p, '--methods', list(attention.METHODS), choices=attention.METHODS, help='methods')

    p = suite('backbone', backbone, threads=0, timeout=300.0, device=None, fresh=False)
    models(p, backbone.DEFAULT_MODELS, backbone.ZOO, choose=True)
    many(p, '--sizes', backbone.DEFAULT_SIZES, type=int)
    p.add_argument('--repeats', type=int, default=10, help='most timed runs')
    p.add_argument('--min-repeats', type=int, default=1, help='fewest timed runs')
    p.add_argument('--budget', type=float, default=10.0, help='seconds of timed runs')
    p.add_argument(
        '--single-run-above',
        type=float,
        default=30.0,
        help='warm-up seconds above which the warm-up is the measurement',
    )
    p.add_argument('--flops', action='store_true', help='also count FLOPs (one more forward)')
    many(
        p,
        '--precisions',
        ['fp32'],
        choices=tuple(PRECISIONS),
        help='fp32 and / or autocast to bf16 / fp16: a table each (files: _bf16 / _fp16)',
    )
    p.add_argument('--batch', type=int, default=1, help='batch size (files: _b<N> unless 1)')
    p.add_argument(
        '--backward',
        action='store_true',
        help="time forward + backward of the outputs' sum (files: _fwdbwd)",
    )

    p = suite(
        'isotropic', isotropic, threads=None, repeat=5, timeout=3600.0, device='cpu', fresh=False
    )
    models(p, isotropic.DEFAULT_MODELS, isotropic.MODELS)
    many(p, '--sizes', isotropic.DEFAULT_SIZES, metavar='S|HxW')
    p.add_argument(
        '--single-run-above',
        type=float,
        default=20.0,
        help='seconds: a slower warm-up is the reported time (one run)',
    )
    p.add_argument('--depth', type=int, help='keep the first DEPTH blocks (smoke tests)')
    p.add_argument('--no-flops', dest='flops', action='store_false', help='skip FLOP counting')
    p.add_argument('--flops-only', action='store_true', help='count FLOPs only, into results')
    p.add_argument('--precision', default='fp32', choices=tuple(PRECISIONS), help='autocast')
    p.add_argument('--batch', type=int, default=1, help='batch size')

    p = suite('compile', compile_suite, threads=None, repeat=5)
    models(p, list(compile_suite.MODELS), list(compile_suite.MODELS))
    many(p, '--sizes', compile_suite.DEFAULT_SIZES, metavar='S|HxW')
    p.add_argument('--backend', default='inductor', help=f'one of {compile_suite.BACKENDS}')
    p.add_argument('--mode', default='default', help=f'one of {compile_suite.MODES}')

    p = suite('compile_train', compile_train, out_dir=False, threads=None, timeout=1800)
    jobs = list(compile_train.JOBS)
    many(p, '--jobs', ['det', 'seg'], metavar='JOB', help=f'from {jobs} (default: det seg)')
    p.add_argument('--iters', type=int, default=20, help='training iterations per run (20)')
    p.add_argument('--warmup', type=int, default=2, help='iterations left out of the median (2)')
    p.add_argument('--backend', default='inductor', help=f'one of {compile_train.BACKENDS}')
    out = osp.join('work_dirs', 'benchmark_compile_train')
    p.add_argument('--data-root', default=out, help='its data/ holds the toy datasets')
    p.add_argument('--out', default=osp.join(out, 'results.json'), help='results file (JSON)')

    p = suite('gpu', gpu, repeat=10, device=None)
    many(p, '--models', ['deit_t', 'ca_deit_t'], choices=gpu.MODELS)
    many(p, '--sizes', [224, 512, 1024, 1536, 2048, 3072, 4096], type=int)
    many(p, '--batches', [1, 32], type=int)
    many(p, '--precisions', ['bf16', 'fp32'], choices=gpu.PRECISIONS)
    many(p, '--modes', ['eager', 'compile'], choices=['eager', 'compile'])
    p.add_argument('--compile-mode', default='reduce-overhead', choices=COMPILE_MODES)
    p.add_argument('--compile-backend', default='inductor', help="'eager' / 'aot_eager' trace")
    p.add_argument('--compile-max-size', type=int, default=2048, help='compile up to this size')
    p.add_argument('--depth', type=int, default=12, help='keep the first DEPTH blocks (of 12)')
    p.add_argument('--budget-s', type=float, default=480.0, help='no new cell after this (s)')

    p = suite('sharded', sharded, threads=2)
    p.add_argument('configs', nargs='+', help='mmseg configs of shardable segmentors')
    p.add_argument('--size', type=int, default=2048, help='image side S (S x S)')
    many(p, '--nprocs', [1, 2], type=int, help='values of P')
    p.add_argument('--train', action='store_true', help='one training step, not inference')

    p = suite('launches', launches, threads=1, repeat=20)
    models(p, list(launches.PAIRS), list(launches.PAIRS), also=' (each beside its peer)')
    many(p, '--sizes', launches.DEFAULT_SIZES, metavar='S')
    p.add_argument('--host-size', type=int, default=64, help='the size of the host time')

    p = suite('kernel', kernel, repeat=20, device=None)
    many(p, '--sizes', kernel.DEFAULT_SIZES, type=int, metavar='S')
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--dim', type=int, default=192, help='channels C (CA-DeiT-T: 192)')
    p.add_argument('--precision', default='bf16', choices=list(PRECISIONS))

    doc = "the documentation's benchmark tables: each suite's run, written between its markers"
    p = suite('docs', docs, doc=doc)
    tables = list(docs.TABLES) + list(docs_stored.STORED)
    p.add_argument('--doc', default=osp.join('docs', 'benchmarks.md'), help='markdown file')
    p.add_argument('--headline', help="the README's short table (default: OUT_DIR/headline.md)")
    many(p, '--tables', tables, choices=tables, metavar='TABLE', help=f'from {tables}')
    p.add_argument('--root', default='.', help='repository root (the stored tables)')
    many(p, '--sizes', list(docs.BACKBONE_SIZES), type=int, help='sides of the backbone tables')
    models(p, list(docs.BACKBONE_MODELS), group('backbone'), choose=True)
    p.add_argument('--no-run', action='store_true', help='render the stores in OUT_DIR only')
    return parser


RUNS = dict(
    attention=run_attention,
    backbone=run_backbone,
    isotropic=run_isotropic,
    compile=run_compile,
    compile_train=run_compile_train,
    gpu=run_gpu,
    sharded=run_sharded,
    launches=run_launches,
    kernel=run_kernel,
    docs=run_docs,
)


def dispatch(argv):
    """Parse ``argv`` (``SUITE [ARGS]``), check the suite's flags and run it."""
    args = build_parser().parse_args(argv)
    name = args.suite
    del args.suite  # the suite's settings alone (the gpu suite stores them)
    return RUNS[name](args, list(argv[1:]))


@main_guard
def main(argv=None):
    """The command: :func:`dispatch`, a bad flag or input one ``error:`` line and exit 1
    (:func:`mmcirc.cli_errors.main_guard`, the commands' one guard)."""
    return dispatch(sys.argv[1:] if argv is None else list(argv))
