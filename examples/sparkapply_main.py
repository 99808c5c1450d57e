"""The file spark-submit runs: ``sparkapply``'s command line, as ``python -m sparkapply``.

spark-submit takes a Python application as a ``.py`` file. It must not be a file inside
the ``sparkapply`` package (``sparkapply/__main__.py``): Python puts a script's folder
first on ``sys.path``, and the package's ``copy`` would then shadow the standard
library's. Copy this file anywhere; it needs sparkapply installed.
"""

import sys

from sparkapply.cli import main

if __name__ == "__main__":
    sys.exit(main())
