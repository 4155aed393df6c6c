"""``python -m mmcirc.benchmark SUITE [ARGS]``: one parser with a subcommand per module of
:mod:`mmcirc.benchmark.suites`; ``SUITE --help`` lists its flags.

A suite module declares itself: its docstring (the first paragraph is its help),
``SHARED`` (which of the shared flags it takes, with its defaults), ``add_arguments(parser)``
(its own flags), ``check(options)`` (optional: a bad value is a ``ValueError`` naming
the flag) and ``run(options)``. Every bad value, argparse's or a check's, is one
``error:`` line and exit 1 (``MMCIRC_DEBUG=1``: the traceback). A list flag given twice
adds its values to the first ones (``--sizes 8 --sizes 16``: both); a single-value flag
given twice takes the last, as in mmcirc's other commands.
"""

import argparse
import importlib
import os.path as osp
import pkgutil
import shlex
import sys

from mmcirc.cli_errors import CLIError, main_guard

from . import suites

PROG = 'python -m mmcirc.benchmark'
#: the flags several suites share: dest -> keywords (``--out-dir`` for ``out_dir``); each
#: suite gives its default
SHARED = dict(
    out_dir=dict(help='folder of the results and tables (default: %(default)s)'),
    threads=dict(type=int, help="torch intra-op threads (default: torch's)"),
    repeat=dict(type=int, help='timed runs (default: %(default)s)'),
    timeout=dict(type=float, help='seconds per child (default: %(default)s)'),
    fresh=dict(action='store_true', help='ignore earlier results in out-dir'),
    device=dict(
        choices=('cpu', 'cuda'), help='(default: %(default)s; None: cuda if torch sees one)'
    ),
)


class Store(argparse.Action):
    """argparse's store, except that a list flag (``nargs`` '+' / '*') given again adds its
    values to those before it, where argparse replaces them."""

    def __call__(self, parser, namespace, values, option_string=None):
        if self.nargs in ('+', '*'):
            kept = getattr(namespace, self.dest, None)
            values = ([] if kept is None or kept is self.default else list(kept)) + list(values)
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are the commands' one ``error:`` line (exit 1) and
    whose flags store with :class:`Store`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register('action', None, Store)

    def error(self, message):
        raise CLIError(message)


def suite_modules() -> dict:
    """name -> module of every suite (the modules of :mod:`mmcirc.benchmark.suites`)."""
    names = sorted(m.name for m in pkgutil.iter_modules(suites.__path__))
    return {n: importlib.import_module(f'{suites.__name__}.{n}') for n in names}


def build_parser() -> argparse.ArgumentParser:
    """The one parser: a subparser per suite module, the shared flags it takes, its own."""
    parser = Parser(prog=PROG, description='Run a benchmark suite (SUITE --help).')
    subs = parser.add_subparsers(dest='suite', metavar='SUITE', required=True)
    for name, module in suite_modules().items():
        doc = ' '.join(module.__doc__.split('\n\n')[0].split())  # its first paragraph
        p = subs.add_parser(name, help=doc.split(': ', 1)[-1].split('; ')[0], description=doc)
        for dest, default in module.SHARED.items():
            if dest == 'out_dir' and default is None:
                default = osp.join('work_dirs', f'benchmark_{name}')
            p.add_argument('--' + dest.replace('_', '-'), default=default, **SHARED[dest])
        module.add_arguments(p)
    return parser


def dispatch(argv):
    """Parse ``argv`` (``SUITE [ARGS]``), check the suite's flags and run it."""
    argv = list(argv)
    options = build_parser().parse_args(argv)
    module = suite_modules()[options.suite]
    options.command = f'{PROG} {shlex.join(argv)}'  # what the results record
    if hasattr(module, 'check'):
        module.check(options)
    return module.run(options)


@main_guard
def main(argv=None):
    """The command: :func:`dispatch`, a bad flag or input one ``error:`` line and exit 1
    (:func:`mmcirc.cli_errors.main_guard`, the commands' one guard)."""
    return dispatch(sys.argv[1:] if argv is None else argv)
