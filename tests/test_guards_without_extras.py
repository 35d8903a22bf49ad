"""Installing looptrace without the guard extras: importing looptrace and its guards package loads none of the
frameworks, and asking for a guard whose framework is missing says which extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

FRAMEWORKS = ("langchain", "langchain_core", "langgraph", "agents", "openai", "claude_agent_sdk")


def test_looptrace_and_its_guards_import_no_framework_and_a_missing_one_names_its_extra():
    code = textwrap.dedent(f"""
        import sys

        FRAMEWORKS = {FRAMEWORKS!r}

        class NotInstalled:  # as in an environment without the extras
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in FRAMEWORKS:
                    raise ModuleNotFoundError(f"No module named {{name!r}}")
                return None

        sys.meta_path.insert(0, NotInstalled())
        import looptrace
        import looptrace.guards as guards
        from looptrace.guards import LoopGuard

        print(sorted(m for m in sys.modules if m.split(".")[0] in FRAMEWORKS))
        try:
            guards.LoopGuardMiddleware
        except ImportError as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded, error = done.stdout.splitlines()
    assert loaded == "[]"
    assert error.startswith("LoopGuardMiddleware needs its framework: pip install 'looptrace[langchain]'")


def test_importing_the_guards_for_real_loads_no_framework():
    """The same with the frameworks installed (this venv has them): nothing loads them until a guard is asked for."""
    code = ("import sys, looptrace, looptrace.guards as g; g.LoopGuard; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
