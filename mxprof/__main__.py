"""``python -m mxprof``: the mxprof command."""

import sys

from .cli import main

sys.exit(main())
