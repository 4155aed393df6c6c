"""``python -m mmcirc.benchmark SUITE [ARGS]``: the entry point of
:mod:`mmcirc.cli.benchmark`."""

if __name__ == '__main__':
    from mmcirc.cli.benchmark import main

    main()
