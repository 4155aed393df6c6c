"""mmcirc's commands, one module per command: its parser and ``main(argv)``; the script
of the same name under ``tools/`` runs it. What they share (the one ``error:`` line, the
common flags): :mod:`.common`; what ``train`` and ``test`` share: :mod:`.runner`.
Importing this package imports none of the commands.
"""
