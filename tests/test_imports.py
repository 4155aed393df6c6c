"""The package's module boundaries hold: read from the source (AST), not by importing it.

* no module imports a ``_private`` name from another mmcirc module (``from m import _x``,
  or ``m._x`` on a module bound by an import);
* the import graph has no cycle between modules, nor between subpackages;
* ``argparse`` is imported only under ``mmcirc/cli/`` (the commands);
* ``CLIError`` (``mmcirc.cli_errors``) is raised or imported only by the commands (the
  library raises ``ValueError`` / ``TypeError`` or its own exception types);
* the library imports none of the commands' code;
* every script under ``tools/`` is a door of a command: its docstring's usage line, ``main``
  imported from ``mmcirc.cli.*``, ``if __name__ == '__main__': main()`` and nothing else.

Every import counts, at module level or inside a function, except those under
``if TYPE_CHECKING:``. ``import a.b.c`` and ``from a.b import c`` point at the module
named, not at the packages above it (whose ``__init__`` also runs, but an edge there
would make every ``__init__`` that imports its own modules a cycle).

Subpackages are the first two dotted parts of a module's name (``mmcirc.apis``; the
root ``mmcirc/__init__.py`` and the root's modules, e.g. ``mmcirc.registry``, count as
themselves). Their arrows point down, in this order (a package imports only those
below it or beside it without a cycle):

    mmcirc.cli
    mmcirc.benchmark / analysis / datasets / cli_errors      (the commands' code)
    mmcirc.apis / deployment / distributed / timm
    mmcirc (the root: registration on ``import mmcirc``)
    mmcirc.models
    mmcirc.engine, mmcirc.ops, mmcirc.registry
    mmcirc.utils

The commands are ``mmcirc/cli/`` and the benchmarks' one command,
``mmcirc.benchmark.command`` (``python -m mmcirc.benchmark``); their one ``error:`` line
is ``mmcirc.cli_errors``. What only the commands use (the benchmark harness, the
analysis probes, the toy data) is the commands' code: the library (:data:`LIBRARY`)
imports none of it.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / 'mmcirc'


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def package_modules():
    """{dotted name: (path, is_package)} for every module under mmcirc/."""
    return {module_name(p): (p, p.name == '__init__.py') for p in sorted(PACKAGE.rglob('*.py'))}


def subpackage(name: str) -> str:
    return '.'.join(name.split('.')[:2])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == 'TYPE_CHECKING') or (
        isinstance(test, ast.Attribute) and test.attr == 'TYPE_CHECKING'
    )


def _import_nodes(tree: ast.AST):
    """Import / ImportFrom nodes anywhere in ``tree`` except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


class ModuleImports:
    """What one module imports from the package: the modules it points at and the
    private names it takes from them."""

    def __init__(self, name: str, path: Path, is_package: bool, modules: dict):
        self.name = name
        self.targets = set()  # dotted names of mmcirc modules imported
        self.private = []  # (line, 'module._name') taken from another module
        self.stdlib = set()  # top-level names of the non-mmcirc modules imported
        self.cli_error = []  # lines that import or raise CLIError
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if getattr(exc, 'id', getattr(exc, 'attr', None)) == 'CLIError':
                    self.cli_error.append(node.lineno)
        bound = {}  # local name -> mmcirc module it is bound to
        for node in _import_nodes(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split('.')[0] != 'mmcirc':
                        self.stdlib.add(alias.name.split('.')[0])
                        continue
                    self.targets.add(alias.name)
                    bound[alias.asname or alias.name.split('.')[0]] = (
                        alias.name if alias.asname else 'mmcirc'
                    )
                continue
            base = self._resolve(node, is_package)
            if not node.level and base and base.split('.')[0] != 'mmcirc':
                self.stdlib.add(base.split('.')[0])
            if base is None or base.split('.')[0] != 'mmcirc':
                continue
            for alias in node.names:
                if alias.name == 'CLIError':
                    self.cli_error.append(node.lineno)
                child = f'{base}.{alias.name}'
                if child in modules:  # from package import submodule
                    self.targets.add(child)
                    bound[alias.asname or alias.name] = child
                    continue
                self.targets.add(base)
                if alias.name.startswith('_') and not alias.name.startswith('__'):
                    self.private.append((node.lineno, f'{base}.{alias.name}'))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and node.attr.startswith('_')
                and not node.attr.startswith('__')
                and f'{bound[node.value.id]}.{node.attr}' not in modules
            ):
                self.private.append((node.lineno, f'{bound[node.value.id]}.{node.attr}'))
        for node in ast.walk(tree):  # importlib.import_module('mmcirc.x') / f'mmcirc.{y}'
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, 'attr', getattr(node.func, 'id', None)) == 'import_module'
                and node.args
            ):
                arg = node.args[0]
                if isinstance(arg, ast.JoinedStr):
                    first = arg.values[0] if arg.values else None
                    prefix = first.value if isinstance(first, ast.Constant) else ''
                else:
                    prefix = arg.value if isinstance(arg, ast.Constant) else ''
                if isinstance(prefix, str) and prefix.startswith('mmcirc.'):
                    self.targets.update(m for m in modules if m.startswith(prefix))
        self.targets.discard(name)

    def _resolve(self, node: ast.ImportFrom, is_package: bool):
        if not node.level:
            return node.module
        parts = self.name.split('.')
        if not is_package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        return '.'.join(parts + ([node.module] if node.module else []))


def import_graph():
    modules = package_modules()
    return {
        name: ModuleImports(name, path, is_package, modules)
        for name, (path, is_package) in modules.items()
    }


def cycles(edges: dict):
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(component, edges):
    arrows = [f'{a} -> {b}' for a in component for b in sorted(edges[a]) if b in component]
    return '{' + ', '.join(component) + '}: ' + '; '.join(arrows)


@pytest.fixture(scope='module')
def graph():
    return import_graph()


def test_no_private_name_is_imported_from_another_module(graph):
    found = [
        f'{imports.name}:{line} uses {target}'
        for imports in graph.values()
        for line, target in imports.private
    ]
    assert not found, 'private names used across modules:\n' + '\n'.join(found)


def test_no_import_cycle_between_modules(graph):
    edges = {name: imports.targets & graph.keys() for name, imports in graph.items()}
    found = cycles(edges)
    assert not found, 'import cycles:\n' + '\n'.join(_describe(c, edges) for c in found)


def test_no_import_cycle_between_subpackages(graph):
    edges = {}
    for name, imports in graph.items():
        for target in imports.targets & graph.keys():
            a, b = subpackage(name), subpackage(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    found = cycles(edges)
    assert not found, 'subpackage cycles:\n' + '\n'.join(_describe(c, edges) for c in found)


COMMANDS = ('mmcirc.benchmark.command',)


def _outside_cli(graph):
    return {n: i for n, i in graph.items() if subpackage(n) != 'mmcirc.cli' and n not in COMMANDS}


def test_argparse_is_imported_only_by_the_commands(graph):
    found = sorted(n for n, i in _outside_cli(graph).items() if 'argparse' in i.stdlib)
    assert not found, 'argparse imported outside mmcirc/cli/: ' + ', '.join(found)


def test_cli_error_lives_only_in_the_commands(graph):
    found = [f'{n}:{line}' for n, i in _outside_cli(graph).items() for line in i.cli_error]
    assert not found, 'CLIError imported or raised outside mmcirc/cli/: ' + ', '.join(found)


#: The library a model user needs, and the commands' code it never imports.
LIBRARY = (
    'mmcirc',
    'mmcirc.apis',
    'mmcirc.deployment',
    'mmcirc.distributed',
    'mmcirc.engine',
    'mmcirc.models',
    'mmcirc.ops',
    'mmcirc.registry',
    'mmcirc.timm',
    'mmcirc.utils',
)
COMMANDS_CODE = (
    'mmcirc.analysis',
    'mmcirc.benchmark',
    'mmcirc.cli',
    'mmcirc.cli_errors',
    'mmcirc.datasets',
)


def test_the_library_imports_none_of_the_commands_code(graph):
    found = [
        f'{name} -> {target}'
        for name, imports in graph.items()
        if subpackage(name) in LIBRARY
        for target in sorted(imports.targets & graph.keys())
        if subpackage(target) in COMMANDS_CODE
    ]
    assert not found, "the library imports the commands' code:\n" + '\n'.join(found)


TOOLS = PACKAGE.parent / 'tools'
DOOR_RUNS = ast.dump(ast.parse("if __name__ == '__main__':\n    main()").body[0])


def door_problems(source: str, path: str):
    """What makes the ``tools/`` script ``path`` more than a door (empty: a door)."""
    tree = ast.parse(source, path)
    doc = ast.get_docstring(tree)
    found = [] if f'python {path}' in (doc or '') else [f'no `python {path} ...` usage line']
    for node in tree.body[1:] if doc else tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('mmcirc.cli.'):
            if [a.asname or a.name for a in node.names] == ['main']:
                continue
        if ast.dump(node) != DOOR_RUNS:
            found.append(f'line {node.lineno}: {ast.unparse(node).splitlines()[0]}')
    return found


def test_every_tools_script_is_a_door_of_a_command():
    scripts = {p.relative_to(TOOLS.parent).as_posix(): p for p in sorted(TOOLS.rglob('*.py'))}
    assert 'tools/analysis/get_flops.py' in scripts
    found = [f'{n}: {x}' for n, p in scripts.items() for x in door_problems(p.read_text(), n)]
    assert not found, 'tools/ scripts are doors of mmcirc/cli (as tools/test.py):\n' + '\n'.join(
        found
    )


def test_a_script_with_its_own_parser_or_code_is_no_door():
    door = (TOOLS / 'test.py').read_text()
    assert door_problems(door, 'tools/test.py') == []
    assert door_problems(door, 'tools/other.py') == ['no `python tools/other.py ...` usage line']
    parser = door.replace('from mmcirc', 'import argparse\nfrom mmcirc')
    assert door_problems(parser, 'tools/test.py') == ['line 6: import argparse']
    logic = door.replace('    main()', '    print(1)\n    main()')
    assert door_problems(logic, 'tools/test.py') == ["line 8: if __name__ == '__main__':"]
