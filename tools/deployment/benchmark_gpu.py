"""CA-DeiT-T against DeiT-T on the GPU: eager vs ``torch.compile``, bf16 and fp32, batch 1
and 32, 224-4096 px, in one run with a time budget.

    PYTHONPATH=. python tools/deployment/benchmark_gpu.py [--device cuda|cpu]
        [--models deit_t ca_deit_t] [--sizes 224 512 1024 1536 2048 3072 4096]
        [--batches 1 32] [--precisions bf16 fp32 fp16] [--modes eager compile]
        [--compile-mode reduce-overhead] [--compile-backend inductor]
        [--compile-max-size 2048] [--repeat 10] [--depth 12] [--budget-s 480] [--out-dir DIR]

Needs torch and timm only: from a copy of the repository that is not installed, run it
from the repository root with ``PYTHONPATH=.`` (or ``python -m mmcirc.benchmark gpu``).
Writes results_<device>.json and table_<device>.md in --out-dir (default
work_dirs/benchmark_gpu). On the CPU (``--device cpu``, small sizes, ``--compile-backend
eager``) it runs the same code paths. The entry point of the harness's ``gpu`` suite
(mmcirc/benchmark/suites/gpu.py), where the method is described.
"""

try:
    from mmcirc.cli.benchmark_gpu import main
except ImportError as err:  # mmcirc neither installed nor on PYTHONPATH
    raise SystemExit(f'error: {err}: run from the repository root with PYTHONPATH=.') from None

if __name__ == '__main__':
    main()
