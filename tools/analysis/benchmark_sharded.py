"""Per-rank memory and time of sharded whole-image inference against one process.

    python tools/analysis/benchmark_sharded.py CONFIG [CONFIG ...] [--size 2048]
        [--nprocs 1 2] [--threads 2] [--out-dir work_dirs/benchmark_sharded]

Writes DIR/results.json and DIR/table.md. The entry point of the harness's ``sharded``
suite (mmcirc/benchmark/suites/sharded.py, also ``python -m mmcirc.benchmark sharded``).
"""

from mmcirc.cli.benchmark_sharded import main

if __name__ == '__main__':
    main()
