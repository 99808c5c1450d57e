"""``python -m sparkapply``."""

import sys

from sparkapply.cli import main

sys.exit(main())
