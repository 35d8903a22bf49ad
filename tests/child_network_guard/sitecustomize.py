"""Started by every Python process a test starts (the conftest puts this folder on PYTHONPATH): the same guard as in
the test process, so a `looptrace` run as a subprocess cannot reach outside the machine either. A refused attempt
fails there as an unreachable network would; the test sees what the program made of it."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import network_guard
finally:
    del sys.path[0]  # the tests folder must not shadow anything the child imports

network_guard.install()
