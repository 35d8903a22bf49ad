"""``python -m looptrace``: the same CLI as the ``looptrace`` command (`detect` and `traces` without the runtime)."""

import sys

from looptrace.cli.entry import main

sys.exit(main())
