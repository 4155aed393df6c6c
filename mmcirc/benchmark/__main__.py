"""``python -m mmcirc.benchmark SUITE [ARGS]``: :func:`mmcirc.benchmark.command.main`."""

if __name__ == '__main__':
    from mmcirc.benchmark.command import main

    main()
