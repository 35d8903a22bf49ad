"""The README and the pages under docs/ say what runs: every Python block runs, every `looptrace` command in a shell
block is one the CLI accepts, every YAML and JSON block parses, and every relative link lands on a file and heading
that exist."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from fakes.messages_api import FakeMessagesAPI

from looptrace.cli.app import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages beside the code whose links are checked too (they are not reference pages the README must link to).
OTHER_PAGES = [ROOT / "dashboards" / "README.md"]
README_LIMIT_BYTES = 20_000

# Pages other branches are writing, linked from here already. A link to one passes while the page is absent; once it
# exists, its links are checked like any other, and the entry must go (test_pages_written_elsewhere_are_still_absent).
PAGES_WRITTEN_ELSEWHERE: set[str] = set()

SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: str

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def code_blocks(page: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    opening: int | None = None
    language = ""
    body: list[str] = []
    for number, line in enumerate(lines, start=1):
        if opening is None and line.startswith("```"):
            opening, language, body = number, line[3:].strip(), []
        elif opening is not None and line.startswith("```"):
            blocks.append(Block(page, opening, language, "\n".join(body) + "\n"))
            opening = None
        elif opening is not None:
            body.append(line)
    assert opening is None, f"{page.relative_to(ROOT)}:{opening}: a code block is never closed"
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in code_blocks(page)]


def blocks_in(*languages: str) -> list[Block]:
    return [block for block in ALL_BLOCKS if block.language in languages]


# --- Python -----------------------------------------------------------------------------------------------------------


def is_pytest_module(block: Block) -> bool:
    return re.search(r"^def test_\w+\(", block.body, re.M) is not None


def runs_with_a_framework(block: Block) -> bool:
    """A guard's example runs inside another framework's loop, with that framework's model: tests/test_guard_readme.py
    runs those with each framework's offline stand-in, so here they are only compiled."""
    return "looptrace.guards" in block.body


@pytest.mark.parametrize("block", blocks_in("python"), ids=lambda block: block.label)
def test_every_python_block_compiles(block):
    compile(block.body, block.label, "exec")


def test_there_are_python_blocks_to_run():
    assert {block.page.name for block in blocks_in("python")} >= {"README.md", "python-api.md", "detector.md"}


# Each page's blocks run in order in one namespace, as a reader pastes them, in a fresh interpreter in an empty
# directory, against a local Messages API that ends every run at once.
RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
for label, code in json.load(sys.stdin):
    print(f"--- {label}", flush=True)
    exec(compile(code, label, "exec"), namespace)
"""


def clean_environment(**extra: str) -> dict[str, str]:
    kept = {name: value for name, value in os.environ.items()
            if not name.startswith(("LOOPTRACE_", "LANGFUSE_", "OTEL_", "TRACEPARENT", "ANTHROPIC_"))}
    return {**kept, **extra}


def pages_with_python(kind) -> list[Path]:
    return sorted({block.page for block in blocks_in("python") if kind(block)})


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with_python(lambda block: not (is_pytest_module(block)
                                                                       or runs_with_a_framework(block))),
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_every_python_block_of_a_page_runs(page, tmp_path):
    blocks = [block for block in blocks_in("python") if block.page == page and not is_pytest_module(block)
              and not runs_with_a_framework(block)]
    answers = [{"stop_reason": "end_turn", "content": [{"type": "text", "text": "Done."}]}] * 50
    with FakeMessagesAPI(answers) as api:
        done = subprocess.run([sys.executable, "-c", RUNNER], cwd=tmp_path, capture_output=True, text=True,
                              input=json.dumps([[block.label, block.body] for block in blocks]), timeout=120,
                              env=clean_environment(ANTHROPIC_BASE_URL=api.url, ANTHROPIC_API_KEY="test-key"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("--- ") == len(blocks)


@pytest.mark.slow
@pytest.mark.parametrize("block", [block for block in blocks_in("python") if is_pytest_module(block)],
                         ids=lambda block: block.label)
def test_every_test_module_block_passes_under_the_plugin(block, tmp_path):
    (tmp_path / "test_from_the_docs.py").write_text(block.body, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_from_the_docs.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=clean_environment())
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b\d+ passed\b", done.stdout) and "failed" not in done.stdout


# --- shell --------------------------------------------------------------------------------------------------------


def shell_words(line: str) -> list[list[str]]:
    """A shell line as its commands' words: split at `;`, `&&`, `||` and `|`, redirections and comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    tokens = list(lexer)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token and set(token) <= set(";&|"):
            commands.append([])
        elif token and set(token) <= set("<>&"):  # a redirection: its target goes too, and an fd number before it
            if commands[-1] and commands[-1][-1].isdigit():
                commands[-1].pop()
            index += 1
        else:
            commands[-1].append(token)
        index += 1
    return [words for words in commands if words]


def looptrace_commands(block: Block) -> list[list[str]]:
    """The argument lists of the `looptrace` commands a shell block runs (`$ ` lines only in a console transcript)."""
    found: list[list[str]] = []
    for line in block.body.splitlines():
        if block.language == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        for words in shell_words(line):
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value before the command
                words.pop(0)
            if words[:1] == ["looptrace"]:
                found.append(words[1:])
    return found


COMMANDS = [(block, argv) for block in blocks_in(*SHELL_LANGUAGES) for argv in looptrace_commands(block)]


def test_the_shell_blocks_hold_looptrace_commands():
    assert len(COMMANDS) >= 20
    assert {argv[0] for _, argv in COMMANDS} >= {"demo", "run", "watch", "detect", "replay"}


@pytest.mark.parametrize(("block", "argv"), COMMANDS,
                         ids=[f"{block.label} {' '.join(argv)}"[:90] for block, argv in COMMANDS])
def test_every_looptrace_command_in_a_shell_block_parses(block, argv, capsys):
    try:
        build_parser().parse_args(argv)
    except SystemExit as exited:
        pytest.fail(f"{block.label}: `looptrace {shlex.join(argv)}` is refused: {capsys.readouterr().err.strip()}"
                    f" (exit {exited.code})")


def test_a_command_the_cli_refuses_is_caught():
    block = Block(ROOT / "README.md", 1, "console", "$ looptrace watch --no-such-flag 2>&1; echo exit $?\n")
    [argv] = looptrace_commands(block)
    assert argv == ["watch", "--no-such-flag"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


# --- data ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", blocks_in("yaml", "yml"), ids=lambda block: block.label)
def test_every_yaml_block_parses(block):
    assert isinstance(yaml.safe_load(block.body), dict)


@pytest.mark.parametrize("block", blocks_in("json"), ids=lambda block: block.label)
def test_every_json_block_parses(block):
    for line in block.body.splitlines():
        if line.strip():
            json.loads(line)


# --- links --------------------------------------------------------------------------------------------------------


def prose(page: Path) -> str:
    """The page without its code blocks and inline code, where a `[x](y)` is not a link."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, repeats -1..."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose_keeping_inline_code(page), re.M):
        text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
        slug = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN").replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def prose_keeping_inline_code(page: Path) -> str:
    return re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)


def links(page: Path) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", prose(page))


def relative_links() -> list[tuple[Path, str]]:
    return [(page, target) for page in PAGES + OTHER_PAGES for target in links(page)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked here


@pytest.mark.parametrize(("page", "target"), relative_links(),
                         ids=[f"{page.relative_to(ROOT)} -> {target}" for page, target in relative_links()])
def test_every_relative_link_lands_on_a_file_and_heading(page, target):
    path_part, _, anchor = target.partition("#")
    destination = (page.parent / path_part).resolve() if path_part else page
    shown = destination.relative_to(ROOT).as_posix() if destination.is_relative_to(ROOT) else str(destination)
    if shown in PAGES_WRITTEN_ELSEWHERE and not destination.exists():
        return
    assert destination.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
    if anchor:
        assert destination.suffix == ".md", f"{page.relative_to(ROOT)}: an anchor into {shown}, not a page"
        assert anchor in heading_anchors(destination), (
            f"{page.relative_to(ROOT)} links to {target}: {shown} has no heading with that anchor")


def test_the_link_check_sees_links_and_anchors():
    assert len(relative_links()) >= 20
    assert "the-python-api" in heading_anchors(ROOT / "README.md")
    assert "which-of-last-weeks-runs-looped-scan-what-langfuse-already-holds" in heading_anchors(
        ROOT / "docs" / "langfuse.md")


def test_pages_written_elsewhere_are_still_absent():
    for page in PAGES_WRITTEN_ELSEWHERE:
        assert not (ROOT / page).exists(), f"{page} exists now: take it off PAGES_WRITTEN_ELSEWHERE"


# --- names -------------------------------------------------------------------------------------------------------


PYTHON_PACKAGES = ("instrumentation", "runtime", "testing", "replay", "cli")  # beside span and metric names


def python_names() -> list[tuple[Path, str]]:
    """`looptrace.<module>[.<name>]` references in prose: modules and classes a reader will import."""
    pattern = re.compile(rf"`(looptrace\.(?:{'|'.join(PYTHON_PACKAGES)})(?:\.\w+)*)`")
    return [(page, name) for page in PAGES
            for name in pattern.findall(prose_keeping_inline_code(page))]


@pytest.mark.parametrize(("page", "name"), python_names(),
                         ids=[f"{page.relative_to(ROOT)}: {name}" for page, name in python_names()])
def test_every_python_name_in_the_prose_imports(page, name):
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            assert hasattr(found, attribute), f"{page.relative_to(ROOT)} names {name}: no {attribute}"
            found = getattr(found, attribute)
        return
    pytest.fail(f"{page.relative_to(ROOT)} names {name}, which does not import")


# --- the README itself --------------------------------------------------------------------------------------------


def test_the_readme_stays_short_and_links_every_docs_page():
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= README_LIMIT_BYTES, f"README.md is {readme.stat().st_size:,} bytes"
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in links(readme)}
    unlinked = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert unlinked == [], f"README.md links to no {unlinked}"
