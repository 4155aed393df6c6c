"""Eager against ``torch.compile`` for one backbone of each family, side by side in one
run: forward time, the speed-up, the first call's compile time, graph breaks and the
compiled output's difference from eager.

    python tools/analysis/benchmark_compile.py [--models ca_pvt_t core_pvt_t ca_swin_t
        ca_deit_t veca_s] [--sizes 224 512] [--backend inductor|aot_eager|eager]
        [--mode default] [--repeat 5] [--threads N] [--out-dir DIR]

Writes DIR/results.json and DIR/table.md (default work_dirs/benchmark_compile). The entry
point of the harness's ``compile`` suite (mmcirc/benchmark/suites/compile.py, also
``python -m mmcirc.benchmark compile``).
"""

from mmcirc.cli.benchmark_compile import main

if __name__ == '__main__':
    main()
