"""``python -m failslow.cli``: the ``failslow`` command."""

import sys

from failslow.cli import main

sys.exit(main())
