"""The attention-analysis commands (``tools/analysis/bccb_score.py``, ``vis_circulant.py``,
``vis_cores.py`` are their entry points): each module's ``main(argv)`` is the command,
its docstring the usage; :mod:`.common` is what they share."""
