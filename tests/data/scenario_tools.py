"""The anomaly scenarios' tools as a tools file, for `looptrace run --tools` in tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from test_anomalies import scenario_tools

read_file, poll_job, poll_stuck, lookup, flaky = scenario_tools()
