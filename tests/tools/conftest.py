"""Fixtures of the tool tests."""

import subprocess

import pytest


@pytest.fixture
def run_main(capsys, monkeypatch):
    """``run_main(main, args, cwd)``: a tool's ``main(args)`` (from the package; the tool
    script is its entry point) run in this process in ``cwd``, as a CompletedProcess
    (return code, stdout, stderr; ``main_guard``'s exit 1 is the return code)."""

    def run(main, args, cwd):
        monkeypatch.chdir(cwd)
        try:
            code = main(args)
        except SystemExit as exit_:  # main_guard: one error line, exit 1
            code = exit_.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return run
