"""``python -m looptrace``: the same CLI as the ``looptrace`` command."""

import sys

from looptrace.runtime.cli import main

sys.exit(main())
