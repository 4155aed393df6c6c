"""Compute operators dispatched per eager forward, and the host time of a forward at a
tiny input, for each mmcirc model beside its peer, on both layouts (``cuda``: the path
of a CUDA tensor, run on the CPU; ``cpu``), in float32 and under bf16 autocast.

    python tools/analysis/benchmark_launches.py [--models ca_deit_t circ_pvt_s ca_pvt_s
        core_pvt_s ca_swin_t] [--sizes 64 1024] [--host-size 64] [--repeat 20]
        [--threads 1] [--out-dir DIR]

Writes DIR/results.json and DIR/table.md (default work_dirs/benchmark_launches). The entry
point of the harness's ``launches`` suite (mmcirc/benchmark/suites/launches.py, also
``python -m mmcirc.benchmark launches``).
"""

from mmcirc.cli.benchmark_launches import main

if __name__ == '__main__':
    main()
