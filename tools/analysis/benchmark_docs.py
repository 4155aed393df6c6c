"""Regenerate the documentation's benchmark tables in one run: every suite a table of
docs/benchmarks.md shows (backbones at 1024 / 2048 px, one attention layer, the isotropic
models, torch.compile, sharded inference), each written between its markers
``<!-- generated: NAME -->`` ... ``<!-- end -->`` with its command and machine; the
README's short backbone table between the ``headline`` markers of ``--headline``.

    python tools/analysis/benchmark_docs.py [--doc docs/benchmarks.md] [--headline FILE]
        [--tables backbones attention isotropic compile sharded] [--sizes 1024 2048]
        [--models ...] [--out-dir work_dirs/benchmark_docs] [--no-run]

The entry point of ``python -m mmcirc.benchmark docs`` (mmcirc/cli/benchmark_docs.py).
"""

from mmcirc.cli.benchmark_docs import main

if __name__ == '__main__':
    main()
