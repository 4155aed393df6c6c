"""Training iterations of the toy detection and segmentation configs, eager against the
compiled backbone and neck (``tools/train.py --compile``): seconds per iteration,
compile time, recompiles after the first iteration and graph breaks.

    python tools/analysis/benchmark_compile_train.py [--jobs det seg det_sizes]
        [--iters 20] [--warmup 2] [--backend inductor|aot_eager|eager] [--threads N]
        [--timeout S] [--data-root DIR] [--out FILE]

Writes FILE (default work_dirs/benchmark_compile_train/results.json). The entry point of
the harness's ``compile_train`` suite (mmcirc/benchmark/suites/compile_train.py, also
``python -m mmcirc.benchmark compile_train``).
"""

from mmcirc.cli.benchmark_compile_train import main

if __name__ == '__main__':
    main()
