"""The README's main job over seeds and attentions: mean and spread of its metrics.

python tools/analysis/main_job_seeds.py [--jobs det seg] [--attentions circulant sra core] [--seeds 0 1 2] [--out-dir work_dirs/main_job_seeds]
"""

from mmcirc.cli.main_job_seeds import main

if __name__ == '__main__':
    main()
