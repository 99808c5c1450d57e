"""The small verbs of the command line, one module each: ``status``, ``skip``, ``cut``,
``resync`` and ``demo``. ``cli.py`` parses the arguments and calls them; ``verify/`` and
``maintain/`` are rooms of their own. Each reaches the publisher through
:func:`sparkapply.source.connection.connect`."""
