"""What a shell command does: the programs it runs, each read as an operation (its program and subcommand).

Coding agents run everything through one tool (`bash`, `execute_bash`, `bash_execute`, `shell`, ...), so the tool's
name says nothing of the operation: `git commit -m fix`, `python -m pytest -q` and `./deploy.sh prod` are three
operations of one tool. This module reads a command line the way a person skims it: split into the commands it chains
(`&&`, `||`, `;`, `|`, new lines), past the wrappers that only change how a program runs (`sudo`, `env`, `timeout`,
`cd` before it, `VAR=value`, `bash -c`), to the program and, for programs that take one, its subcommand (`git
commit`, `pip install`, `python -m pytest`, `npm test`, `make deploy`). Filters after a pipe (`| tail -20`) and
shell bookkeeping (`cd`, `echo`, `sleep`, `export`) are not operations. Heredoc bodies are skipped.

Pure standard library (`shlex`); the start of a command is read (`_MAX_COMMAND_CHARS`), and results are cached:
agents run the same commands again and again.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Mapping
from typing import NamedTuple

_MAX_COMMAND_CHARS = 4_000  # of a command, the start is read: the operation is named long before a heredoc's end
_MAX_NESTING = 2  # `bash -c "..."` inside `sudo bash -c "..."`: deeper is not worth reading

# Argument names that hold the command line of a call that runs one (OpenHands `execute_bash`, MCP `bash_execute`,
# Claude Code `Bash`, Codex `shell`, ...). A list of words (`["git", "commit"]`) is joined.
COMMAND_ARGUMENTS = ("command", "cmd", "commands", "script")
# Words in a tool's name that say it runs commands, for a tool whose one string argument is named otherwise.
_SHELL_TOOL_WORDS = frozenset({"bash", "shell", "sh", "zsh", "terminal", "exec", "execute", "cmd", "command",
                               "powershell", "console"})

_OPERATOR_CHARS = frozenset(";&|()<>\n")
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "\n", "(", ")", "|&", ";;", "{", "}"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Not operations of their own: moving about, setting up, printing, waiting, and the shell's own tests.
_BOOKKEEPING = frozenset({"cd", "pushd", "popd", "export", "source", ".", "set", "unset", "echo", "printf", "true",
                          "false", "sleep", "exit", "wait", "trap", "alias", "shopt", ":", "test", "[", "[[", "]]",
                          "]", "local", "declare", "readonly", "return", "fi", "done", "for", "case", "esac", "in",
                          "function", "clear", "pwd", "umask",
                          "ulimit", "hash", "type", "which", "history", "eval"})
# Shell keywords that lead into the command they govern: `if pytest; then git commit ...; fi`.
_KEYWORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{", "time"})
# Programs that only change how the next one runs; the number is how many of their own arguments follow (besides
# flags, which are skipped in any case).
_WRAPPERS = {"sudo": 0, "env": 0, "time": 0, "nice": 0, "nohup": 0, "timeout": 1, "stdbuf": 0, "exec": 0,
             "command": 0, "builtin": 0, "xargs": 0, "npx": 0, "pnpx": 0, "bunx": 0, "unbuffer": 0, "caffeinate": 0,
             "chronic": 0, "ionice": 0, "taskset": 1, "flock": 1, "watch": 0, "strace": 0, "valgrind": 0}
# Their flags that take a value: `sudo -u root`, `timeout -s KILL 30`, `env -u VAR`.
_WRAPPER_VALUE_FLAGS = frozenset({"-u", "-g", "-s", "-k", "-C", "-p", "-n", "-o", "-e", "--signal", "--user"})
# `uv run pytest`, `poetry run pytest`, `bundle exec rspec`: the program after the runner's subcommand.
_RUNNERS = {"uv": "run", "poetry": "run", "pipenv": "run", "pdm": "run", "hatch": "run", "rye": "run",
            "bundle": "exec", "conda": "run", "mamba": "run", "pixi": "run", "nix": "run", "docker": "exec"}
# Filters at the end of a pipe: what they print is the command's, their status is not its operation.
_FILTERS = frozenset({"head", "tail", "grep", "egrep", "fgrep", "rg", "sed", "awk", "tee", "sort", "uniq", "wc", "cut",
                      "tr", "less", "more", "cat", "column", "jq", "xargs", "nl", "fold", "fmt", "tac", "rev"})
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh"})
_INTERPRETERS = frozenset({"python", "python2", "python3", "pypy", "pypy3", "node", "ruby", "perl", "php", "deno",
                           "bun", "Rscript"})
# Programs whose first plain argument is a subcommand (`git commit`, `pip install`, `make deploy`).
_WITH_SUBCOMMANDS = frozenset({
    "git", "hg", "svn", "pip", "pip3", "npm", "yarn", "pnpm", "bun", "cargo", "go", "docker", "podman", "kubectl",
    "helm", "terraform", "tofu", "pulumi", "make", "gmake", "just", "poetry", "uv", "pdm", "hatch", "apt", "apt-get",
    "yum", "dnf", "apk", "brew", "gh", "glab", "conda", "mamba", "gem", "bundle", "rails", "rake", "dotnet", "mvn",
    "gradle", "gradlew", "manage.py", "setup.py", "alembic", "flask", "django-admin", "fly", "flyctl", "vercel",
    "netlify", "firebase", "serverless", "sls", "heroku", "gcloud", "aws", "az", "ansible", "sbt", "mix", "deno",
    "composer", "swift", "flutter", "dart", "prisma", "knex", "sequelize", "flyway", "liquibase", "twine", "tox",
    "nox", "systemctl", "service", "kamal", "cap", "skaffold", "tilt", "doctl", "wrangler", "npm-run", "rustup",
})
# Options of those programs that take a value before the subcommand: `git -C path commit`, `make -C dir deploy`.
_GLOBAL_VALUE_FLAGS = frozenset({"-C", "-c", "-f", "--file", "--directory", "--git-dir", "--work-tree", "-e",
                                 "--project", "--profile", "--region", "--context", "-n", "--namespace", "-p"})


class Operation(NamedTuple):
    """One program a command runs: its name (a script's file name, `python -m X`'s module) and its subcommand
    ("" when it takes none or none was given)."""

    program: str
    subcommand: str = ""

    @property
    def name(self) -> str:
        """``git commit``, ``pytest``: how the operation reads."""
        return f"{self.program} {self.subcommand}" if self.subcommand else self.program


def command_of(tool: str, arguments: object) -> str | None:
    """The command line a call runs, or None for a call that runs none.

    A call runs one when it has a string argument named `command`, `cmd`, `commands` or `script` (or a list of words
    under that name), or when its tool's name says it runs commands (`bash`, `shell`, `terminal`, `exec`) and it has
    exactly one string argument. Arguments given as JSON text (as a trace reader may) are parsed.
    """
    if isinstance(arguments, str):
        # Arguments as JSON text (a trace reader's): most calls run no command, and say so without being parsed.
        if not _runs_commands(tool) and not any(name in arguments for name in COMMAND_ARGUMENTS):
            return None
        arguments = _parsed(arguments)
        if arguments is None:
            return None
    if not isinstance(arguments, Mapping):
        return None
    for name in COMMAND_ARGUMENTS:
        value = arguments.get(name)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list) and value and all(isinstance(word, str) for word in value):
            return shlex.join(value)
    strings = [value for value in arguments.values() if isinstance(value, str)]
    if len(strings) == 1 and strings[0].strip() and _runs_commands(tool):
        return strings[0]
    return None


def operations(command: str) -> tuple[Operation, ...]:
    """The operations a command line runs, in order, each once (see the module's docstring)."""
    return _operations(command[:_MAX_COMMAND_CHARS], 0)


@functools.lru_cache(maxsize=512)
def _operations(command: str, depth: int) -> tuple[Operation, ...]:
    found: dict[Operation, None] = {}
    for words, piped in _simple_commands(_tokens(command)):
        operation = _operation(words, piped, depth)
        if isinstance(operation, tuple) and operation and isinstance(operation[0], Operation):
            found.update(dict.fromkeys(operation))  # `bash -c "..."`: the operations inside
        elif isinstance(operation, Operation):
            found[operation] = None
    return tuple(found)


def _tokens(command: str) -> list[str]:
    """The command's words (quotes removed) and its control operators and redirections, as the shell splits them.

    A regular expression rather than `shlex`: this runs for the commands of every failing call, and shlex reads a
    character at a time. A quote left open (a command cut short) ends the word there."""
    tokens = []
    for match in _TOKEN.finditer(command):
        kind = match.lastgroup
        if kind == "operator":
            tokens.append(match.group())
        elif kind == "word":
            word = match.group()
            tokens.append(_UNQUOTE.sub(_unquoted, word) if ("'" in word or '"' in word or "\\" in word) else word)
        elif kind == "other" and match.group() in "'\"":
            break  # a quote left open: the command was cut inside it, and the rest is its text
    return tokens


_TOKEN = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<operator>&&|\|\||;;|\|&|<<-?|\d*>>?&?|\d*<&?|&>>?|[;&|()\n])
  | (?P<word>(?:[^\s;&|()<>'"\\]|\\.|'[^']*'|"(?:[^"\\]|\\.)*")+)
  | (?P<space>[ \t\r]+|\\\n)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)
_UNQUOTE = re.compile(r"""'([^']*)'|"((?:[^"\\]|\\.)*)"|\\(.)""", re.DOTALL)


def _unquoted(match: re.Match[str]) -> str:
    single, double, escaped = match.groups()
    if single is not None:
        return single
    if double is not None:
        return re.sub(r"\\(.)", r"\1", double)
    return escaped


def _simple_commands(tokens: list[str]) -> list[tuple[list[str], bool]]:
    """The simple commands of a token list: (their words, redirections left out; whether a pipe fed them)."""
    commands: list[tuple[list[str], bool]] = []
    words: list[str] = []
    piped = False
    skip_next = False
    for token in _without_heredoc_bodies(tokens):
        if skip_next:  # the target of a redirection
            skip_next = False
            continue
        if ("<" in token or ">" in token) and set(token.lstrip("0123456789")) <= _OPERATOR_CHARS:
            if words and words[-1].isdigit():  # the file descriptor of `2>&1`
                words.pop()
            skip_next = True  # its target: a file, or the descriptor of `>&`
            continue
        if token in _SEPARATORS or set(token) <= _OPERATOR_CHARS:
            if words:
                commands.append((words, piped))
            words = []
            piped = token in ("|", "|&")
            continue
        words.append(token)
    if words:
        commands.append((words, piped))
    return commands


def _without_heredoc_bodies(tokens: list[str]) -> list[str]:
    """The tokens with each heredoc (`<< EOF`, its delimiter and its body, up to the line holding the delimiter
    alone) left out: a file written through a heredoc is not a command."""
    if "<<" not in tokens and "<<-" not in tokens:
        return tokens
    kept: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token not in ("<<", "<<-"):
            kept.append(token)
            index += 1
            continue
        delimiter = tokens[index + 1] if index + 1 < len(tokens) else ""
        line_end = index + 2
        while line_end < len(tokens) and tokens[line_end] != "\n":
            line_end += 1
        kept.extend(tokens[index + 2:line_end])  # the rest of the line: `cat << EOF > file.py`, `| python`
        body = line_end + 1
        while body < len(tokens) and not (tokens[body] == delimiter and tokens[body - 1] == "\n"):
            body += 1
        index = body + 1
    return kept


def _operation(words: list[str], piped: bool, depth: int) -> Operation | tuple[Operation, ...] | None:
    """The operation of one simple command, past its assignments and wrappers; None for bookkeeping or a filter."""
    index = 0
    while index < len(words):
        word = words[index]
        program = _program_name(word)
        if _ASSIGNMENT.match(word) or word in _KEYWORDS:  # VAR=value, `then`
            index += 1
        elif program in _WRAPPERS:
            index = _past_wrapper(words, index + 1, _WRAPPERS[program])
        elif program in _RUNNERS and index + 1 < len(words) and words[index + 1] == _RUNNERS[program]:
            index = _past_flags(words, index + 2)
        else:
            break
    if index >= len(words):
        return None
    program = _program_name(words[index])
    rest = words[index + 1:]
    if _no_operation(words[index], program, piped):
        return None
    if program in _SHELLS:
        return _shell(rest, depth)
    if program in _INTERPRETERS or re.fullmatch(r"python\d(\.\d+)?", program):
        return _interpreted(program, rest)
    if program in _WITH_SUBCOMMANDS:
        return Operation(program, _subcommand(rest))
    return Operation(program)


def _no_operation(word: str, program: str, piped: bool) -> bool:
    """Bookkeeping (`cd`, `echo`; the word as written, so `bin/test` is a program and `test` the builtin), a filter
    after a pipe, or no program at all (`-o` left after a `$( ... )`, a stray quote)."""
    return (word in _BOOKKEEPING or (piped and program in _FILTERS) or not program
            or (not program[0].isalnum() and program[0] not in "._"))


def _shell(rest: list[str], depth: int) -> Operation | tuple[Operation, ...] | None:
    """`bash -c "..."` runs the commands inside; `bash script.sh` runs the script."""
    for position, word in enumerate(rest):
        if word == "-c" or (word.startswith("-") and not word.startswith("--") and word.endswith("c")):
            if position + 1 < len(rest) and depth < _MAX_NESTING:
                return _operations(rest[position + 1][:_MAX_COMMAND_CHARS], depth + 1)
            return None
        if not word.startswith("-"):
            return Operation(_program_name(word))
    return None


def _interpreted(program: str, rest: list[str]) -> Operation | None:
    """`python -m pytest -q` is pytest; `python manage.py migrate` is manage.py's migrate; `python -c` is the
    interpreter itself."""
    index = 0
    while index < len(rest):
        word = rest[index]
        if word == "-m" and index + 1 < len(rest):
            module = rest[index + 1]
            tail = rest[index + 2:]
            name = module.rsplit(".", 1)[-1] if module.endswith(".__main__") else module
            return Operation(name, _subcommand(tail) if name in _WITH_SUBCOMMANDS else "")
        if word in ("-c", "-e", "--eval", "-p", "--print"):
            return Operation(_family_program(program), "-c")
        if word.startswith("-"):
            index += 1
            continue
        script = _program_name(word)
        return Operation(script, _subcommand(rest[index + 1:]) if script in _WITH_SUBCOMMANDS else "")
    return Operation(_family_program(program))


def _family_program(program: str) -> str:
    """python3.11 and python3 are python."""
    return "python" if program.startswith("python") else program


def _subcommand(rest: list[str]) -> str:
    """The first plain word after the program's own options (a `make` target, `git`'s `commit`)."""
    index = 0
    while index < len(rest):
        word = rest[index]
        if word in _GLOBAL_VALUE_FLAGS:
            index += 2
        elif word.startswith("-") or _ASSIGNMENT.match(word):
            index += 1
        else:
            return word.lower()[:64]
    return ""


def _past_wrapper(words: list[str], index: int, values: int) -> int:
    while index < len(words) and (words[index].startswith("-") or _ASSIGNMENT.match(words[index])):
        index += 2 if words[index] in _WRAPPER_VALUE_FLAGS else 1
    return min(index + values, len(words))


def _past_flags(words: list[str], index: int) -> int:
    while index < len(words) and words[index].startswith("-"):
        index += 1
    return index


def _program_name(word: str) -> str:
    """A program as it is named: the file name of a path (`./scripts/deploy.sh` -> `deploy.sh`)."""
    return word.rstrip("/").rsplit("/", 1)[-1][:128]


@functools.lru_cache(maxsize=256)
def _runs_commands(tool: str) -> bool:
    words = re.findall(r"[a-z]+", re.sub(r"(?<=[a-z])(?=[A-Z])", " ", tool).lower())
    return any(word in _SHELL_TOOL_WORDS for word in words)


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> object:
    if not text.lstrip().startswith("{"):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


# Flags that force a retry past what stopped it (a hook, a prompt, a conflict) without changing what is attempted:
# `git commit --no-verify` after `git commit` failed is the same commit, tried again.
_OVERRIDE_FLAGS = re.compile(r"(?<!\S)(?:--no-verify|--force|--force-with-lease(?:=\S*)?|-f|--yes|-y|--assume-yes)"
                             r"(?!\S)")
# The same as arguments of a tool: `git_commit(message=..., no_verify=True)`. Compared without "_" and "-", any case.
_OVERRIDE_ARGUMENTS = frozenset({"noverify", "force", "yes", "assumeyes", "skiphooks", "skipverify", "skipchecks"})


def without_override_flags(tool: str, arguments: object) -> dict[object, object] | None:
    """The call's arguments without the flags that force a retry (`--no-verify`, `--force`, `-f`, `--yes`; or a
    boolean argument named so), or None when it has none: what a failure streak compares, so that adding such a
    flag to a failing call does not make it a new call."""
    if isinstance(arguments, str):
        parsed = _parsed(arguments)
        if parsed is None:
            return None
        arguments = parsed
    if not isinstance(arguments, Mapping):
        return None
    kept = {name: value for name, value in arguments.items()
            if not (isinstance(value, bool) and isinstance(name, str)
                    and name.replace("_", "").replace("-", "").lower() in _OVERRIDE_ARGUMENTS)}
    command = command_of(tool, kept)
    if command is not None and _OVERRIDE_FLAGS.search(command):
        for name in COMMAND_ARGUMENTS:
            if kept.get(name) == command:
                kept[name] = " ".join(_OVERRIDE_FLAGS.sub(" ", command).split())
                break
    return kept if kept != arguments else None
