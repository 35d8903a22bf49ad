"""The producers' current releases, which the test venv cannot hold beside the pinned ones (one version per venv).

OpenLLMetry's anthropic instrumentation is pinned below 0.54 in the `test` extra (its indexed prompts); its current
release (tests/constraints/current-producers.txt) writes `gen_ai.input.messages` instead. These tests install it from
the package index into a venv of its own under tmp, layered over the test venv (every other package comes from there,
so only the producer differs), and run tests/foreign_agents.py with that venv's Python: bare (no parent span, no
session id, as most people instrument a loop) and wrapped in a workflow span, each looping and clean, read by
`looptrace detect` from a file and by `looptrace watch` over OTLP/HTTP.

Without the package index they skip, saying why; with ``LOOPTRACE_REQUIRE_CURRENT_PRODUCERS=1`` (as .ci/run sets for
its `pytest -q`) an index that cannot be reached fails them instead. pip is the one process let past the tests'
network guard, to reach the index; the producers it installs run guarded like every other child.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from looptrace.cli.app import main
from looptrace.instrumentation.alerts import Alerts
from looptrace.instrumentation.watch import WatchServer, WatchSettings

pytestmark = [pytest.mark.slow, pytest.mark.current_producers]

TESTS = Path(__file__).parent
AGENTS = TESTS / "foreign_agents.py"
CONSTRAINTS = TESTS / "constraints" / "current-producers.txt"
PRODUCER = "opentelemetry-instrumentation-anthropic"


def _pinned(name: str) -> str:
    for line in CONSTRAINTS.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement.startswith(f"{name}=="):
            return requirement.split("==", 1)[1]
    raise AssertionError(f"{name} is not pinned in {CONSTRAINTS}")


_UNMET_REQUIREMENTS = """
import importlib.metadata as metadata, sys
from packaging.requirements import Requirement
for line in metadata.requires(sys.argv[1]) or []:
    requirement = Requirement(line)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    try:
        found = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        found = None
    if found is None or not requirement.specifier.contains(found, prereleases=True):
        print(requirement, "found", found)
"""


def _without_network_guard() -> dict[str, str]:
    """This environment with the tests' child network guard (tests/child_network_guard) off PYTHONPATH."""
    guard = str(TESTS / "child_network_guard")
    env = dict(os.environ)
    kept = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != guard]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


def _unavailable(reason: str) -> None:
    if os.environ.get("LOOPTRACE_REQUIRE_CURRENT_PRODUCERS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def current_python(tmp_path_factory) -> str:
    """A Python whose OpenLLMetry is the current release and whose other packages are the test venv's."""
    version = _pinned(PRODUCER)
    venv = tmp_path_factory.mktemp("current-producers") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    layered = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The new venv's own site-packages come first on its path, so its producer shadows the test venv's; the test
    # venv's directory is added as a site directory so that its .pth files (the editable looptrace) work too.
    Path(layered, "zz-test-venv.pth").write_text(
        "".join(f"import site; site.addsitedir({directory!r})\n" for directory in site.getsitepackages()))
    # pip alone may reach the package index: the tests' network guard (on PYTHONPATH for every child) would make
    # every index look empty ("ResolutionImpossible"), so pip runs without it. The agents it installs run guarded.
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", layered,
         "--constraint", str(CONSTRAINTS), f"{PRODUCER}=={version}"], capture_output=True, text=True, timeout=600,
        env=_without_network_guard())
    if installed.returncode != 0:
        _unavailable(f"{PRODUCER}=={version} could not be installed from the package index: "
                     f"{installed.stderr.strip().splitlines()[-1:]}")
    found = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({PRODUCER!r}))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert found == version, f"the layered venv runs {PRODUCER} {found}, not {version}"
    # Installed without its dependencies: the test venv's must satisfy what it asks for, or the constraint set is wrong.
    unmet = subprocess.run([python, "-c", _UNMET_REQUIREMENTS, PRODUCER], capture_output=True, text=True, check=True)
    assert not unmet.stdout.strip(), f"{PRODUCER}=={version} needs what the test venv lacks: {unmet.stdout}"
    return python


def produce(python: str, *flags: str) -> None:
    completed = subprocess.run([python, str(AGENTS), "--producer", "openllmetry", *flags], capture_output=True,
                               text=True, timeout=180)
    assert completed.returncode == 0, completed.stderr[-2000:]


@pytest.fixture(scope="module")
def current_spans(current_python, tmp_path_factory) -> dict[tuple[bool, str], Path]:
    """The span files of both layouts, each process running the looping variant and then the clean one."""
    folder = tmp_path_factory.mktemp("current-openllmetry")
    paths = {(bare, scenario): folder / f"{'bare' if bare else 'wrapped'}-{scenario}.jsonl"
             for bare in (True, False) for scenario in ("repeat", "clean")}
    for bare in (True, False):
        produce(current_python, "--scenario", "repeat", "--file", str(paths[bare, "repeat"]),
                "--then", f"clean={paths[bare, 'clean']}", *(["--bare"] if bare else []))
    return paths


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "wrapped"])
@pytest.mark.parametrize("scenario", ["repeat", "clean"])
def test_detect_over_the_current_openllmetrys_spans(current_spans, capsys, bare, scenario):
    path = current_spans[bare, scenario]
    spans = path.read_text()
    assert '"gen_ai.input.messages"' in spans and '"gen_ai.prompt.0.content"' not in spans  # the current format
    code = main(["detect", "--json", "--all", str(path)])
    verdicts = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(verdicts) == 1, verdicts
    calls = 8 if scenario == "repeat" else 1
    assert (verdicts[0]["turns"], verdicts[0]["tool_calls"]) == (calls + 1, calls)
    assert [a["type"] for a in verdicts[0]["anomalies"]] == (["repeated_call"] if scenario == "repeat" else [])
    assert code == (1 if scenario == "repeat" else 0)
    # Its tool results carry no error flag: the rules that need one say they did not run.
    assert "no error flag" in verdicts[0]["rules_not_run"]["ignored_error"]


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "wrapped"])
def test_watch_over_the_current_openllmetrys_export(current_python, bare):
    alerts: list = []
    server = WatchServer(WatchSettings(port=0, grpc_port=None),
                         alerts=Alerts(callback=lambda anomaly, context: alerts.append(anomaly.type))).start()
    try:
        for scenario in ("repeat", "clean"):
            produce(current_python, "--scenario", scenario, "--service", scenario,
                    "--otlp", f"http://127.0.0.1:{server.port}/v1/traces", *(["--bare"] if bare else []))
        assert server.wait_idle()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert alerts == ["repeated_call"]
        assert 'anomaly_type="repeated_call",service="repeat"} 1.0' in metrics
        assert 'service="clean"' not in metrics
    finally:
        server.stop()
