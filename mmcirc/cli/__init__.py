"""mmcirc's commands, one module per command: its parser and ``main(argv)``; the script
of the same name under ``tools/`` runs it. What they share (the one ``error:`` line, the
common flags): :mod:`.common`; what ``train`` and ``test`` share: :mod:`.runner`. The
library below raises ``ValueError`` / ``TypeError`` and holds no argument parser;
importing this package imports none of the commands.
"""
