"""The Triton kernel of circulant attention's core against the FFT path and SDPA (flash):
one attention layer on 14 x 14, 32 x 32 and 64 x 64 maps, forward and training, bf16,
``tl.dot`` in float32 and TF32, time and error.

    PYTHONPATH=. python tools/deployment/benchmark_kernel.py [--device cuda|cpu]
        [--sizes 14 32 64] [--batch 32] [--dim 192] [--precision bf16] [--repeat 20]
        [--out-dir DIR]

Needs torch and triton only. Writes results_<device>.json and table_<device>.md in
--out-dir (default work_dirs/benchmark_kernel). On the CPU the kernel runs in Triton's
interpreter (a rehearsal at tiny sizes). The entry point of the harness's ``kernel`` suite
(mmcirc/benchmark/suites/kernel.py, where the method is described).
"""

try:
    from mmcirc.cli.benchmark_kernel import main
except ImportError as err:  # mmcirc neither installed nor on PYTHONPATH
    raise SystemExit(f'error: {err}: run from the repository root with PYTHONPATH=.') from None

if __name__ == '__main__':
    main()
