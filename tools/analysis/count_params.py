"""Parameters of each named CA/Core pyramid as an ImageNet classifier.

python tools/analysis/count_params.py [--baselines]
"""

from mmcirc.cli.count_params import main

if __name__ == '__main__':
    main()
