"""The structure a newcomer relies on: names in one place, the detector free of OpenTelemetry, one narrow interface
between the loop and telemetry, no import cycle, packages that hand their names out through their faces, and the
environment read only where the program starts.

The import graph is read from the source (``ast``): every ``import`` and ``from ... import`` at any depth (the lazy
ones inside functions too), and those under ``if TYPE_CHECKING:`` as well: they never run, but a cycle through one is
still a knot a reader (and mypy) has to untie, so no cycle may close through them either.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from looptrace import Agent, ScriptedModel, tool
from looptrace.instrumentation import detector
from looptrace.instrumentation.recording.no_tracing import NoTracing

ROOT = Path(__file__).resolve().parent.parent
# Where each package's source sits in the checkout (pyproject.toml's package-dir).
PACKAGE_DIRS = {"looptrace": ROOT / "looptrace", "looptrace.runtime": ROOT / "runtime",
                "looptrace.instrumentation": ROOT / "instrumentation"}
PRODUCT = [path for folder in PACKAGE_DIRS.values() for path in folder.rglob("*.py")]

# The entry points, which alone read the environment (ARCHITECTURE.md): the settings reader itself, configure() and
# an Agent's own pipeline (setup), an Agent built without telemetry (agent_telemetry), and the CLI's one reader, which
# `looptrace watch` goes through too.
ENTRY_POINTS = {
    "looptrace.instrumentation.settings",
    "looptrace.instrumentation.export.setup",
    "looptrace.instrumentation.agent_telemetry",
    "looptrace.cli.environment",
}
# What the runtime may take from instrumentation beyond the interface and the detector's public names: the one factory
# that builds an Agent's telemetry where the Agent is built, and (for a type hint) what configure() returns.
RUNTIME_FACTORY = ("looptrace.instrumentation.agent_telemetry", {"agent_telemetry", "Telemetry", "mcp_telemetry", "MCPServerTelemetry"})


@functools.cache
def module_sources() -> dict[str, Path]:
    """Every module of the product by its import name."""
    modules = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = [part for part in path.relative_to(folder).with_suffix("").parts if part != "__init__"]
            modules[".".join([package, *parts])] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path], source: str | None = None) -> set[str]:
    """The product modules ``name`` imports, type-checking imports included: ``from . import x`` counts as importing
    x when x is a module."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = (".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])
                    if node.level else node.module or "")
            named.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    found = set()
    for module in named:
        while module and module not in modules:
            module = module.rpartition(".")[0]
        if module and module != name:
            found.add(module)
    return found


def import_graph(overrides: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the product modules it imports; ``overrides`` replaces modules' source (to test the test)."""
    modules = module_sources()
    overrides = overrides or {}
    return {name: imports_of(name, path, modules, overrides[name]) if name in overrides else set(_imports(name))
            for name, path in modules.items()}


@functools.cache  # each module is read once per session, whichever test asks
def _imports(name: str) -> frozenset[str]:
    modules = module_sources()
    return frozenset(imports_of(name, modules[name], modules))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def runtime_reaches_into_instrumentation(graph: dict[str, set[str]],
                                         sources: dict[str, str] | None = None) -> dict[str, list[str]]:
    """What each runtime module takes from instrumentation beyond the interface, the detector's public names and the
    one factory (``RUNTIME_FACTORY``)."""
    allowed = {"looptrace.instrumentation.interface"}
    factory, factory_names = RUNTIME_FACTORY
    public_detector = set(detector.__all__)
    modules = module_sources()
    wrong: dict[str, list[str]] = {}
    for name, imported in graph.items():
        if not name.startswith("looptrace.runtime"):
            continue
        tree = ast.parse((sources or {}).get(name) or modules[name].read_text(encoding="utf-8"))
        taken = {(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and (node.module or "").startswith("looptrace.instrumentation") for alias in node.names}
        bad = sorted(f"{module}.{what}" for module, what in taken
                     if module not in allowed and not (module.startswith("looptrace.instrumentation.detector")
                                                      and what in public_detector)
                     and not (module == factory and what in factory_names))
        bad += sorted(module for module in imported if module.startswith("looptrace.instrumentation")
                      and module not in allowed | {factory}
                      and not module.startswith("looptrace.instrumentation.detector"))
        if bad:
            wrong[name] = sorted(set(bad))
    return wrong


@functools.cache
def _reads_the_environment(name: str) -> bool:
    return reads_the_environment(module_sources()[name].read_text(encoding="utf-8"))


def reads_the_environment(source: str) -> bool:
    """Whether code (not its docstrings or comments) reads ``os.environ``, calls ``getenv`` or any ``from_env()``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv"):
            return True
        if isinstance(node, ast.Call):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("from_env", "getenv"):
                return True
    return False


def environment_readers(sources: dict[str, str] | None = None) -> list[str]:
    """Modules outside the entry points that read the environment or call a from_env()."""
    sources = sources or {}
    return sorted(name for name in module_sources() if name not in ENTRY_POINTS
                  and (reads_the_environment(sources[name]) if name in sources else _reads_the_environment(name)))


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_a_cycle_added_on_purpose_is_caught():
    # The interface imports content; a lazy import back, inside a function, closes a cycle all the same.
    content = (PACKAGE_DIRS["looptrace.instrumentation"] / "recording" / "content.py").read_text(encoding="utf-8")
    sneaky = {"looptrace.instrumentation.recording.content": content + "\n\ndef _later():\n    from ..interface import Usage\n"}
    both = {"looptrace.instrumentation.recording.content", "looptrace.instrumentation.interface"}
    assert any(both <= set(group) for group in cycles(import_graph(sneaky)))


def test_a_cycle_through_a_type_checking_import_is_caught():
    # interface imports content at run time; content naming interface's types for mypy alone closes a cycle too.
    content = (PACKAGE_DIRS["looptrace.instrumentation"] / "recording" / "content.py").read_text(encoding="utf-8")
    typing_only = {"looptrace.instrumentation.recording.content": content + (
        "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..interface import RunTrace\n")}
    both = {"looptrace.instrumentation.recording.content", "looptrace.instrumentation.interface"}
    assert not any(both <= set(group) for group in cycles(import_graph()))
    assert any(both <= set(group) for group in cycles(import_graph(typing_only)))


# --- packages: the layers point down ------------------------------------------------------------------------------

# Each subpackage of instrumentation and each of its top-level modules is one node; so are the runtime, the CLI and
# the guards; any other module of the looptrace package is a node of its own.
_PACKAGE_NODES = ("looptrace.instrumentation.", "looptrace.runtime", "looptrace.cli", "looptrace.guards")


def package_of(module: str) -> str:
    """The node of the package graph ``module`` belongs to."""
    if module.startswith("looptrace.instrumentation."):
        return ".".join(module.split(".")[:3])
    for package in _PACKAGE_NODES[1:]:
        if module == package or module.startswith(package + "."):
            return package
    return module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded into packages: an edge from a package to each other package one of its modules
    imports (lazy and type-checking imports included, as in the module graph)."""
    folded: dict[str, set[str]] = {}
    for module, imported in graph.items():
        node = package_of(module)
        folded.setdefault(node, set()).update(package_of(other) for other in imported)
    for node, imported in folded.items():
        imported.discard(node)
    for imported in list(folded.values()):
        for other in imported:
            folded.setdefault(other, set())
    return folded


def test_no_cycle_between_packages():
    assert cycles(package_graph(import_graph())) == []


def test_a_cycle_between_packages_added_on_purpose_is_caught():
    # The trace file's writer reading offline's run rebuilder, lazily: offline reads the trace file, so this closes
    # a cycle between the two packages although no module imports itself back.
    name = "looptrace.instrumentation.tracefile.write"
    source = module_sources()[name].read_text(encoding="utf-8")
    sneaky = {name: source + "\n\ndef _later():\n    from ..offline.run_rebuilder import RunRebuilder\n"}
    both = {"looptrace.instrumentation.tracefile", "looptrace.instrumentation.offline"}
    assert not any(both <= set(group) for group in cycles(package_graph(import_graph())))
    assert any(both <= set(group) for group in cycles(package_graph(import_graph(sneaky))))
    assert cycles(import_graph(sneaky)) == []  # no module-level cycle: only the package graph shows it


def test_a_type_checking_import_between_packages_closes_a_cycle_too():
    name = "looptrace.instrumentation.detector.types"
    source = module_sources()[name].read_text(encoding="utf-8")
    typing_only = {name: source + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                               "    from ..recording.spans import Tracing\n"}
    both = {"looptrace.instrumentation.detector", "looptrace.instrumentation.recording"}
    assert any(both <= set(group) for group in cycles(package_graph(import_graph(typing_only))))


# What the spans may not know of: the layers above them (ARCHITECTURE.md: detector <- recording <- tracefile <-
# offline <- alerts, langfuse, export <- watch).
ABOVE_RECORDING = ("looptrace.instrumentation.alerts", "looptrace.instrumentation.langfuse",
                   "looptrace.instrumentation.export")


def recording_reaches_up(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module of recording/ and what it imports of alerts, langfuse or export (lazily or for types too)."""
    return {module: sorted(other for other in imported if package_of(other) in ABOVE_RECORDING)
            for module, imported in graph.items()
            if package_of(module) == "looptrace.instrumentation.recording"
            and any(package_of(other) in ABOVE_RECORDING for other in imported)}


def test_recording_imports_none_of_alerts_langfuse_or_export():
    assert recording_reaches_up(import_graph()) == {}


@pytest.mark.parametrize("sneaky", [
    "\n\ndef _later():\n    from ..alerts import AnomalySinks\n",
    "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..langfuse.mapping import RunFacts\n",
    "\n\ndef _later():\n    from looptrace.instrumentation.export.setup import own_telemetry\n",
])
def test_recording_reaching_up_on_purpose_is_caught(sneaky):
    name = "looptrace.instrumentation.recording.providers"
    source = module_sources()[name].read_text(encoding="utf-8")
    assert name in recording_reaches_up(import_graph({name: source + sneaky}))


def test_the_interface_builds_no_implementation():
    # The protocols and the plain types both sides speak; what implements them is the factory's to import.
    imported = import_graph()["looptrace.instrumentation.interface"]
    assert not imported & {"looptrace.instrumentation.recording.spans", "looptrace.instrumentation.recording.no_tracing",
                           "looptrace.instrumentation.agent_telemetry", "looptrace.instrumentation.export.setup"}


def test_the_runtime_reaches_telemetry_only_through_the_interface():
    assert runtime_reaches_into_instrumentation(import_graph()) == {}


@pytest.mark.parametrize("forbidden", [
    "from looptrace.instrumentation.recording.spans import Tracing",
    "from looptrace.instrumentation.detector import _state",  # not among the detector's public names
    "from looptrace.instrumentation import setup",
    "from looptrace.instrumentation.agent_telemetry import anomaly_sinks",  # the factory, but not its one function
    "from looptrace.instrumentation.recording.no_tracing import NoTracing",
])
def test_a_forbidden_runtime_import_is_caught(forbidden):
    path = PACKAGE_DIRS["looptrace.runtime"] / "limits.py"
    source = path.read_text(encoding="utf-8") + f"\n\ndef _later():\n    {forbidden}\n"
    overrides = {"looptrace.runtime.limits": source}
    assert "looptrace.runtime.limits" in runtime_reaches_into_instrumentation(import_graph(overrides), overrides)


# --- faces: other packages take a package's names from its __init__ -----------------------------------------------

# The rooms that import product code only through package faces (ARCHITECTURE.md), or from inside themselves.
FACE_USERS = ("looptrace.cli", "looptrace.guards", "looptrace.replay", "looptrace.report")


@functools.cache
def faces() -> frozenset[str]:
    """Every package's ``__init__`` (runtime, instrumentation, each of their subpackages, looptrace's own) and each
    module at the top of ``looptrace`` (rooms of their own: replay, version, testing, pytest_plugin)."""
    return frozenset(name for name, path in module_sources().items()
                     if path.name == "__init__.py" or path.parent == PACKAGE_DIRS["looptrace"])


@functools.cache
def face_names(face: str) -> frozenset[str] | None:
    """The names a face lists in ``__all__`` (read from its source, a literal list), or None when it lists none."""
    tree = ast.parse(module_sources()[face].read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets):
            assert node.value is not None
            return frozenset(ast.literal_eval(node.value))
    return None


def _handed_out(face: str, name: str) -> bool:
    """Whether ``from face import name`` takes what the face hands out: a name it lists in ``__all__`` (a public one
    when it lists none), or a face of its own (``from looptrace import examples``). Any other module of the package
    is a reach past the face, whether the face would find it or not."""
    if f"{face}.{name}" in faces():
        return True
    listed = face_names(face)
    return name in listed if listed is not None else not (name.startswith("_") and not name.startswith("__"))


def _room_of(module: str) -> str | None:
    return next((room for room in FACE_USERS if module == room or module.startswith(room + ".")), None)


def reaches_past_faces(sources: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Each module of the CLI, the guards, replay and the report, and what it imports of another package other than
    through that package's face: at any depth (in functions too) and under ``if TYPE_CHECKING:`` as well. A face
    hands out what it lists in ``__all__``; ``from looptrace.instrumentation.export import setup`` reaches past it as
    much as ``from looptrace.instrumentation.export.setup import configure`` does. ``sources`` replaces modules'
    source (to test the test)."""
    sources = sources or {}
    modules = module_sources()
    found: dict[str, list[str]] = {}
    for name, path in modules.items():
        room = _room_of(name)
        if room is None:
            continue
        tree = ast.parse(sources.get(name) or path.read_text(encoding="utf-8"))
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        wrong = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wrong += [f"{node.lineno}: import {alias.name}" for alias in node.names
                          if alias.name.split(".")[0] == "looptrace" and _room_of(alias.name) != room
                          and alias.name not in faces()]
            elif isinstance(node, ast.ImportFrom):
                base = (".".join([*package[:len(package) - node.level + 1], *([node.module] if node.module else [])])
                        if node.level else node.module or "")
                if base.split(".")[0] != "looptrace" or _room_of(base) == room:
                    continue
                taken = [alias.name for alias in node.names
                         if base not in faces() or not _handed_out(base, alias.name)]
                if taken:
                    wrong.append(f"{node.lineno}: from {base} import {', '.join(taken)}")
        if wrong:
            found[name] = wrong
    return found


def test_the_cli_guards_replay_and_report_import_only_package_faces():
    assert reaches_past_faces() == {}


@pytest.mark.parametrize(("module", "sneaky"), [
    # a submodule's name, in a function: the face hands the same function out
    ("looptrace.cli.list_command", "\n\ndef _later():\n    from looptrace.instrumentation.tracefile.read import read_lines\n"),
    # for type checkers only: it still ties the guards to where the runtime keeps its Agent
    ("looptrace.guards.core", "\n\nif TYPE_CHECKING:\n    from looptrace.runtime.agent import Agent\n"),
    # a module taken through the face, which does not list it
    ("looptrace.replay", "\n\ndef _later():\n    from looptrace.instrumentation.export import setup\n"),
    ("looptrace.report.page", "\n\nimport looptrace.instrumentation.offline.trace_detect\n"),
    # relative, from a package of the room: the same reach
    ("looptrace.cli.views", "\n\ndef _later():\n    from ..instrumentation.settings import Settings\n"),
    # a name the face does not list
    ("looptrace.report.facts", "\n\nfrom looptrace.instrumentation.detector import _state\n"),
    ("looptrace.guards.langchain_guard", "\n\nfrom looptrace.runtime import policy\n"),
])
def test_a_reach_past_a_face_added_on_purpose_is_caught(module, sneaky):
    source = module_sources()[module].read_text(encoding="utf-8")
    assert module not in reaches_past_faces()
    assert module in reaches_past_faces({module: source + sneaky})


def test_a_room_imports_freely_from_inside_itself():
    # The CLI's own modules are the CLI's to arrange; so are the report's. Faces are for what crosses a room's wall.
    source = module_sources()["looptrace.cli.views"].read_text(encoding="utf-8")
    inside = "\n\ndef _later():\n    from looptrace.cli.trace_reading import read_spans_with_progress\n"
    assert "looptrace.cli.views" not in reaches_past_faces({"looptrace.cli.views": source + inside})


def names_not_resolved(module_name: str) -> list[str]:
    """The names a face lists in ``__all__`` that it cannot give (a name moved, a module renamed): each is looked up
    as a user would, ``getattr`` on the imported face. A name that needs an optional framework not installed here
    (the guards' adapters) is left out."""
    face = importlib.import_module(module_name)
    missing = []
    for name in face.__all__:
        try:
            getattr(face, name)
        except ImportError as exc:
            cause = exc.__cause__ if isinstance(exc.__cause__, ModuleNotFoundError) else exc
            if not (isinstance(cause, ModuleNotFoundError) and (cause.name or "").split(".")[0] != "looptrace"):
                missing.append(f"{name}: {exc}")
        except AttributeError as exc:
            missing.append(f"{name}: {exc}")
    return missing


LISTING_FACES = sorted(face for face in faces() if face_names(face) is not None)


@pytest.mark.parametrize("face", LISTING_FACES)
def test_every_name_a_face_lists_resolves(face):
    assert names_not_resolved(face) == []


def test_a_face_pointing_at_a_name_that_moved_is_caught(tmp_path, monkeypatch):
    # A lazy face like the product's, whose map still names the module a function has left.
    package = tmp_path / "moved_face_pkg"
    package.mkdir()
    (package / "home.py").write_text("def stays():\n    return 1\n")
    (package / "__init__.py").write_text(textwrap.dedent("""
        import importlib

        _EXPORTS = {"stays": "home", "moved": "home"}
        __all__ = ["moved", "stays"]


        def __getattr__(name):
            module = _EXPORTS.get(name)
            if module is None:
                raise AttributeError(name)
            return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "moved_face_pkg", raising=False)
    assert [entry.split(":")[0] for entry in names_not_resolved("moved_face_pkg")] == ["moved"]


def statically_bound(tree: ast.Module) -> set[str]:
    """The names a module binds at its top level, in ``if`` blocks too (``if TYPE_CHECKING:``): what a type checker
    sees it define, without running its ``__getattr__``."""
    bound: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {target.id for target in targets if isinstance(target, ast.Name)}
    return bound


@pytest.mark.parametrize("face", LISTING_FACES)
def test_type_checkers_see_every_name_a_face_lists(face):
    # A lazy face names each of its names again under `if TYPE_CHECKING:`, so that mypy and IDEs know their types.
    tree = ast.parse(module_sources()[face].read_text(encoding="utf-8"))
    assert sorted(face_names(face) - statically_bound(tree)) == []


def test_only_the_entry_points_read_the_environment():
    assert environment_readers() == []


def test_an_environment_read_below_the_entry_points_is_caught():
    content = (PACKAGE_DIRS["looptrace.instrumentation"] / "recording" / "content.py").read_text(encoding="utf-8")
    assert "looptrace.instrumentation.recording.content" not in environment_readers()
    reading = {"looptrace.instrumentation.recording.content": content + "\nimport os\nos.environ.get('X')\n"}
    assert "looptrace.instrumentation.recording.content" in environment_readers(reading)


def test_every_emitted_name_is_defined_in_semconv_or_in_its_vendors_mapping():
    ours = re.compile(r"""["']((?:looptrace|gen_ai)\.[a-z_]+(?:\.[a-z_]+)*\.?)["']""")
    vendors = re.compile(r"""["'](langfuse\.[a-z_]+(?:\.[a-z_]+)*\.?)["']""")
    # readers.py reads other producers' names (legacy gen_ai.prompt.*, langfuse.session.id): not ours to emit.
    found = {path.name: ours.findall(path.read_text(encoding="utf-8"))
             for path in PRODUCT if path.name not in ("semconv.py", "readers.py")}
    assert {file: names for file, names in found.items() if names} == {}
    # Langfuse's own attributes are named by its mapping, the one module that adds them (semconv names the one
    # older files carry, which replay reads).
    vendor_home = ROOT / "instrumentation" / "langfuse" / "mapping.py"
    found = {path.name: vendors.findall(path.read_text(encoding="utf-8")) for path in PRODUCT
             if path != vendor_home and path.name not in ("semconv.py", "readers.py")}
    assert {file: names for file, names in found.items() if names} == {}


def test_the_detector_works_where_opentelemetry_is_not_installed():
    code = textwrap.dedent("""
        import sys

        class NoOpenTelemetry:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, NoOpenTelemetry())
        from looptrace.instrumentation.detector import LoopDetector, ToolCall
        from looptrace import LoopDetector as Same

        detector = LoopDetector()
        found = []
        for turn in range(1, 6):
            detector.observe(ToolCall(turn=turn, tool="search", arguments={"q": "x"}, call_id=f"c{turn}",
                                      is_error=False, result="same"))
            found += detector.end_turn(turn)
        print(Same is LoopDetector, sorted({a.type for a in found}))
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, loaded = done.stdout.splitlines()
    assert first == "True ['repeated_call']" and loaded == "[]"


def test_agent_py_uses_no_private_attribute_of_another_object():
    for module in ("agent.py", "loop.py"):  # the drivers and the core they drive
        source = (ROOT / "runtime" / module).read_text(encoding="utf-8")
        assert re.findall(r"\b\w+\._(?!_)\w+", _without_self(source)) == [], module


MAX_RUNTIME_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def oversized(sources: dict[str, str]) -> list[str]:
    """Modules over ``MAX_RUNTIME_MODULE_LINES`` lines and functions over ``MAX_FUNCTION_LINES`` (decorators and
    docstrings counted), as "path: N lines" or "path:line name: N lines"."""
    found = []
    for path, source in sorted(sources.items()):
        lines = source.count("\n") + (not source.endswith("\n"))
        if lines > MAX_RUNTIME_MODULE_LINES:
            found.append(f"{path}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{path}:{node.lineno} {node.name}: {length} lines")
    return found


def runtime_sources() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
            for path in sorted((ROOT / "runtime").glob("*.py"))}


def test_no_runtime_module_is_over_500_lines_and_no_function_over_60():
    assert oversized(runtime_sources()) == []


def test_a_long_runtime_module_or_function_added_on_purpose_is_caught():
    sources = runtime_sources()
    long_function = "def sprawl():\n" + "    x = 1\n" * MAX_FUNCTION_LINES
    sources["runtime/loop.py"] += "\n\n" + long_function
    sources["runtime/sprawl.py"] = "\n" * (MAX_RUNTIME_MODULE_LINES + 1)
    found = oversized(sources)
    assert any(line.startswith("runtime/loop.py:") and "sprawl" in line for line in found)
    assert "runtime/sprawl.py: 501 lines" in found


def _without_self(source: str) -> str:
    return re.sub(r"\b(self|cls|run|call|agent)\._\w+", "", re.sub(r'""".*?"""|#.*', "", source, flags=re.S))


def test_telemetry_off_is_the_no_op_implementation_and_still_redacts_arguments(spans):
    seen = []

    @tool
    def login(user: str, password: str) -> str:
        """Logs in."""
        return "ok"

    agent = Agent("claude-sonnet-5-5", tools=[login], telemetry=False, tracer_provider=spans.provider,
                  on_event=seen.append, client=ScriptedModel([
                      {"stop_reason": "tool_use", "content": [{"type": "tool_use", "id": "t1", "name": "login",
                                                               "input": {"user": "ana", "password": "hunter2"}}]},
                      {"stop_reason": "end_turn", "content": [{"type": "text", "text": "in"}]}]))
    result = agent.run("log in")
    assert result.status.value == "done" and result.trace_id == "0" * 32
    assert spans.all == []
    tool_events = [e for e in seen if type(e).__name__ == "ToolFinished"]
    assert "hunter2" not in repr(tool_events) and "ana" in repr(tool_events)
    assert isinstance(agent._tracing, NoTracing)


def test_the_trace_file_package_loads_no_network_code():
    # The one durable copy is a file: writing it, reading it and listing what a backend did not take need no HTTP,
    # gRPC or network exporter (the SDK's OTLP/JSON encoder, which writes the lines, is no network code). Pushing
    # (instrumentation/export/push.py) is where the network comes in.
    code = ("import sys\nimport looptrace.instrumentation.tracefile.write, looptrace.instrumentation.tracefile.read, "
            "looptrace.instrumentation.tracefile.undelivered\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('requests', 'grpc', 'urllib3') "
            "or m.startswith(('opentelemetry.exporter.otlp.proto', 'looptrace.instrumentation.export.delivery', "
            "'looptrace.instrumentation.export.exporters', 'looptrace.instrumentation.export.push'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", (done.stdout, done.stderr)


def test_the_span_detection_modules_import_one_way():
    # trace_detect offers the live processor, so the processor and the rebuilder it shares with `looptrace detect`
    # must not import trace_detect back.
    imported = {name: set(re.findall(r"from \.(\w+) import", (ROOT / "instrumentation" / "offline" / f"{name}.py").read_text()))
                for name in ("trace_detect", "trace_detect_live", "run_rebuilder")}
    assert {"run_rebuilder", "trace_detect_live"} <= imported["trace_detect"]
    assert "run_rebuilder" in imported["trace_detect_live"]
    assert "trace_detect" not in imported["trace_detect_live"] | imported["run_rebuilder"]
    assert "trace_detect_live" not in imported["run_rebuilder"]


def test_the_trace_file_format_reads_no_environment():
    # Its settings come from the entry points (configure(), the CLI) as values or a Settings, never from here.
    modules = [*(ROOT / "instrumentation" / "tracefile").glob("*.py")]
    for path in modules:
        code = re.sub(r'""".*?"""|#.*', "", path.read_text(encoding="utf-8"), flags=re.S)
        assert re.findall(r"\benviron\b|\bgetenv\b|\bfrom_env\b", code) == [], path.name


def test_no_private_attribute_of_an_opentelemetry_object_is_used():
    # An SDK release may rename or remove any of these at will: product code touches OpenTelemetry's public API only.
    assert private_opentelemetry_uses() == []


@pytest.mark.parametrize("sneaky", [
    "\n\ndef _peek(processor):\n    return len(processor._batch_processor._queue)\n",
    "\n\ndef _peek(exporter):\n    return getattr(exporter, '_preferred_temporality', None)\n",
    "\n\nfrom opentelemetry.sdk.trace import TracerProvider as _P\n\n\nclass _Mine(_P):\n"
    "    def processors(self):\n        return self._active_span_processor\n",
])
def test_a_private_opentelemetry_attribute_added_on_purpose_is_caught(sneaky):
    name = "looptrace.instrumentation.recording.content"
    content = (PACKAGE_DIRS["looptrace.instrumentation"] / "recording" / "content.py").read_text(encoding="utf-8")
    assert not any(use.startswith("content.py") for use in private_opentelemetry_uses())
    assert any(use.startswith("content.py") for use in private_opentelemetry_uses({name: content + sneaky}))


@functools.cache
def opentelemetry_private_names() -> frozenset[str]:
    """Every private attribute name (``_x``, not dunder) the installed OpenTelemetry packages define on their objects:
    assigned as ``something._x = ...`` or defined in a class body. Generated protobuf modules aside."""
    import opentelemetry

    names: set[str] = set()
    for folder in opentelemetry.__path__:
        for path in Path(folder).rglob("*.py"):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            names |= _private_names_defined(ast.parse(path.read_text(encoding="utf-8")))
    return frozenset(names)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_defined(tree: ast.AST) -> set[str]:
    """Private names a module defines on objects: attributes it assigns, and its class bodies' members."""
    names = {node.attr for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(member.name)
                targets = member.targets if isinstance(member, ast.Assign) else (
                    [member.target] if isinstance(member, ast.AnnAssign) else [])
                names.update(t.id for t in targets if isinstance(t, ast.Name))
                if isinstance(member, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                          for t in member.targets):
                    names.update(c.value for c in ast.walk(member.value)
                                 if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return {name for name in names if _private(name)}


def _named_private_attribute(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(receiver, name) for ``receiver._name`` and ``getattr/hasattr/setattr(receiver, "_name", ...)``."""
    if isinstance(node, ast.Attribute) and _private(node.attr):
        return node.value, node.attr
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)):
        return node.args[0], node.args[1].value
    return None


def private_opentelemetry_uses(overrides: dict[str, str] | None = None) -> list[str]:
    """Where product code reads or writes a private attribute of an OpenTelemetry object.

    Two ways in: ``thing._x`` (or ``getattr(thing, "_x")``) where OpenTelemetry defines ``_x`` and the product itself
    defines no ``_x`` anywhere (so it can only be OpenTelemetry's), and ``self._x`` inside a subclass of an
    OpenTelemetry class that does not define ``_x`` itself (an inherited private). Each module is read once per
    session (``_module_privates``); ``overrides`` replaces modules' source (to test the test)."""
    overrides = overrides or {}
    scanned = {name: _scan_privates(name, overrides[name]) if name in overrides else _module_privates(name)
               for name in module_sources()}
    ours = set().union(*(defined for defined, _ in scanned.values()))
    return sorted(text for _, uses in scanned.values() for on_self_bad, attribute, text in uses
                  if (on_self_bad if on_self_bad is not None else attribute not in ours))


@functools.cache
def _module_privates(name: str) -> tuple[frozenset[str], tuple[tuple[bool | None, str, str], ...]]:
    return _scan_privates(name, module_sources()[name].read_text(encoding="utf-8"))


def _scan_privates(name: str, source: str) -> tuple[frozenset[str], tuple[tuple[bool | None, str, str], ...]]:
    """One module's private names (defined, imported from elsewhere than OpenTelemetry) and its uses of a private
    name OpenTelemetry defines: (for ``self._x``, whether the OpenTelemetry subclass lacks ``_x`` itself, else None:
    decided against the product's names), the name, and where."""
    tree = ast.parse(source)
    ours = set(_private_names_defined(tree))
    ours |= {node.name for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(node.name)}
    ours |= {alias.asname or alias.name for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and not (node.module or "").startswith("opentelemetry")
             for alias in node.names}
    theirs = opentelemetry_private_names()
    from_opentelemetry = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                          and (node.module or "").startswith("opentelemetry") for alias in node.names}
    inherited: dict[int, set[str]] = {}  # node id -> what its OpenTelemetry subclass does not define itself
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(base).split(".")[0] in from_opentelemetry
                                                  for base in node.bases):
            own = _private_names_defined(ast.Module(body=[node], type_ignores=[]))
            for inner in ast.walk(node):
                inherited[id(inner)] = own
    uses = []
    where = module_sources()[name].name
    for node in ast.walk(tree):
        named = _named_private_attribute(node)
        if named is None or named[1] not in theirs:
            continue
        receiver, attribute = named
        on_self = (isinstance(receiver, ast.Name) and receiver.id in ("self", "cls")) or (
            isinstance(receiver, ast.Call) and getattr(receiver.func, "id", "") == "super")
        on_self_bad = (id(node) in inherited and attribute not in inherited[id(node)]) if on_self else None
        uses.append((on_self_bad, attribute, f"{where}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)[:80]}"))
    return frozenset(ours), tuple(uses)


def test_no_private_opentelemetry_name_is_imported():
    # The semantic-conventions package publishes the GenAI names (still incubating) only under `_incubating`.
    found = []
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opentelemetry"):
                imported = [(node.module, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [(alias.name, "") for alias in node.names if alias.name.startswith("opentelemetry")]
            else:
                continue
            for module, name in imported:
                if module.startswith("opentelemetry.semconv._incubating."):
                    continue
                if any(part.startswith("_") for part in [*module.split("."), name]):
                    found.append(f"{path.name}:{node.lineno}: {module} {name}".strip())
    assert found == []


MAX_TOP_ENTRIES = 12


def top_entries(folder: Path) -> list[str]:
    """What a newcomer sees opening a package's folder: its modules and subpackages, not ``__init__`` or caches."""
    return sorted(entry.name for entry in folder.iterdir()
                  if entry.name not in ("__init__.py", "__pycache__") and (entry.suffix == ".py" or entry.is_dir()))


def crowded(folder: Path) -> list[str]:
    """The folder's top entries when there are more than a dozen (grouped by concern they would be fewer), else []."""
    entries = top_entries(folder)
    return entries if len(entries) > MAX_TOP_ENTRIES else []


def test_instrumentation_shows_at_most_a_dozen_concerns_at_its_top():
    assert crowded(ROOT / "instrumentation") == []


def test_a_thirteenth_entry_at_the_top_of_instrumentation_is_caught(tmp_path):
    for entry in top_entries(ROOT / "instrumentation"):
        (tmp_path / entry).mkdir() if (ROOT / "instrumentation" / entry).is_dir() else (tmp_path / entry).touch()
    assert crowded(tmp_path) == []
    for extra in range(MAX_TOP_ENTRIES + 1 - len(top_entries(tmp_path))):
        (tmp_path / f"extra_{extra}.py").touch()
    assert len(crowded(tmp_path)) == MAX_TOP_ENTRIES + 1
