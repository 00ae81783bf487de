"""What a Bash command line runs, read the way the shell reads it — in linear time.

Why a tokeniser and not regular expressions: the hook used to search the raw command with
backtracking regexes such as ``kubectl\\b[^;&|\\n]*\\b(apply|…)``; on a crafted 20 KB command
each start position re-scanned the rest of the line (quadratic: 19 s of CPU, no token
needed). And a regex over the raw text is easy to step around: ``/usr/local/bin/kubectl``,
``k\\ubectl``, ``sudo``/``env`` prefixes, ``bash -c '…'``. Here one left-to-right pass splits
the line into simple commands and words (quotes and backslashes resolved as the shell does),
nested text (``$(…)``, backticks, ``bash -c``, ``eval``) is read by the same pass at most
``MAX_NESTING`` levels deep, so the work is O(length × MAX_NESTING); and the rules compare
*words* (the program's base name, its sub-commands) with sets — no pattern can backtrack.

A command word that is computed when the line runs (``$(echo kube)ctl``, ``$TOOL``) cannot
be known here: it is reported as ``dynamic`` and the hook refuses it rather than guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_NESTING = 6

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "busybox"})
# Programs that run another program given in their arguments, with the options of theirs that
# take a value (so the value is not taken for the program).
WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "-R"}),
    "doas": frozenset({"-u", "-C"}),
    "env": frozenset({"-u", "-C", "--unset", "--chdir"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset({"-a"}),
    "nohup": frozenset(),
    "time": frozenset({"-f", "-o"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "ionice": frozenset({"-c", "-n", "-p", "-t"}),
    "timeout": frozenset({"-s", "-k", "--signal", "--kill-after"}),
    "xargs": frozenset({"-I", "-n", "-P", "-L", "-d", "-E", "-s", "-a", "--max-args"}),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "setsid": frozenset(),
    "chronic": frozenset(),
    "unbuffer": frozenset(),
    "watch": frozenset({"-n", "-d", "--interval"}),
    "strace": frozenset({"-e", "-o", "-p", "-s", "-u"}),
    "ltrace": frozenset({"-e", "-o", "-p", "-s", "-u"}),
}
# Wrappers whose first positional argument is theirs, not the program (timeout's duration).
_WRAPPER_POSITIONALS = {"timeout": 1}


@dataclass
class Word:
    parts: list[str] = field(default_factory=list)
    dynamic: bool = False  # contains $(…), `…` or $VAR: its value is known only at run time
    started: bool = False

    @property
    def text(self) -> str:
        return "".join(self.parts)


@dataclass(frozen=True)
class SimpleCommand:
    """One program run: its base name and its arguments (quotes resolved)."""

    program: str
    args: tuple[str, ...]
    dynamic: bool = False  # the program name itself is computed at run time
    raw_program: str = ""


@dataclass
class Parsed:
    commands: list[SimpleCommand] = field(default_factory=list)
    too_deep: bool = False


def _closing_paren(text: str, start: int) -> int:
    """Index of the ``)`` closing the ``(`` before ``start``, or len(text)."""
    depth = 1
    i = start
    n = len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "'":
            end = text.find("'", i + 1)
            i = n if end < 0 else end + 1
            continue
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return n


def _words(text: str, nested: list[str]) -> list[list[Word]]:
    """Split ``text`` into simple commands of words; nested command text goes to ``nested``."""
    commands: list[list[Word]] = []
    current: list[Word] = []
    word = Word()
    i = 0
    n = len(text)

    def end_word() -> None:
        nonlocal word
        if word.started:
            current.append(word)
        word = Word()

    def end_command() -> None:
        nonlocal current
        end_word()
        if current:
            commands.append(current)
        current = []

    def substitution(i: int) -> int:
        """At ``$`` or a backtick: record what runs inside, mark the word dynamic."""
        word.started = True
        if text[i] == "`":
            end = text.find("`", i + 1)
            end = n if end < 0 else end
            nested.append(text[i + 1 : end])
            word.dynamic = True
            return end + 1
        following = text[i + 1 : i + 2]
        if following == "(":
            end = _closing_paren(text, i + 2)
            nested.append(text[i + 2 : end])
            word.dynamic = True
            return end + 1
        if following == "{":
            end = text.find("}", i + 2)
            word.dynamic = True
            return n if end < 0 else end + 1
        if following and (following.isalnum() or following in "_@*#?$!-"):
            j = i + 1
            if following.isalpha() or following == "_":
                while j < n and (text[j].isalnum() or text[j] == "_"):
                    j += 1
            else:
                j += 1
            word.dynamic = True
            return j
        word.parts.append("$")
        return i + 1

    while i < n:
        char = text[i]
        if char == "\\":
            if i + 1 < n and text[i + 1] != "\n":
                word.parts.append(text[i + 1])
                word.started = True
            i += 2
        elif char == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            word.parts.append(text[i + 1 : end])
            word.started = True
            i = end + 1
        elif char == '"':
            word.started = True
            i += 1
            while i < n and text[i] != '"':
                inner = text[i]
                if inner == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                    word.parts.append(text[i + 1])
                    i += 2
                elif inner in "$`":
                    i = substitution(i)
                else:
                    word.parts.append(inner)
                    i += 1
            i += 1
        elif char in "$`":
            i = substitution(i)
        elif char in " \t\r":
            end_word()
            i += 1
        elif char in "<>":
            # A redirection: the operator ends the word; `>&2` / `&>` are not separators.
            end_word()
            i += 1
            while i < n and text[i] in "<>&|":
                i += 1
        elif char == "&" and text[i + 1 : i + 2] == ">":
            end_word()
            i += 2
        elif char in ";&|\n(){}":
            end_command()
            i += 1
        elif char == "#" and not word.started:
            end = text.find("\n", i)
            i = n if end < 0 else end
        else:
            word.parts.append(char)
            word.started = True
            i += 1
    end_command()
    return commands


def _unwrap(words: list[Word], nested: list[str]) -> SimpleCommand | None:
    """Skip assignments and wrappers (sudo, env, timeout…); shells with -c and eval nest."""
    i = 0
    n = len(words)
    while i < n:
        word = words[i]
        if not word.dynamic and _ASSIGNMENT.match(word.text):
            i += 1
            continue
        name = word.text.rsplit("/", 1)[-1]
        if word.dynamic:
            return SimpleCommand(name, tuple(w.text for w in words[i + 1 :]), True, word.text)
        if name in WRAPPERS:
            takes_value = WRAPPERS[name]
            positionals = _WRAPPER_POSITIONALS.get(name, 0)
            i += 1
            while i < n:
                text = words[i].text
                if name == "env" and text in ("-S", "--split-string") and i + 1 < n:
                    nested.append(words[i + 1].text)
                    return None
                if text.startswith("-") and text != "-":
                    i += 2 if text in takes_value else 1
                elif name == "env" and _ASSIGNMENT.match(text):
                    i += 1
                elif positionals:
                    positionals -= 1
                    i += 1
                else:
                    break
            continue
        args = tuple(w.text for w in words[i + 1 :])
        if name in SHELLS:
            for position, arg in enumerate(args):
                if arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]:
                    if position + 1 < len(args):
                        nested.append(args[position + 1])
                    break
        elif name == "eval":
            nested.append(" ".join(args))
        return SimpleCommand(name, args, False, word.text)
    return None


def parse(text: str) -> Parsed:
    """Every simple command ``text`` runs, nested ones included (module doc)."""
    parsed = Parsed()
    level = [text]
    for _ in range(MAX_NESTING + 1):
        deeper: list[str] = []
        for piece in level:
            for words in _words(piece, deeper):
                command = _unwrap(words, deeper)
                if command is not None:
                    parsed.commands.append(command)
        if not deeper:
            return parsed
        level = deeper
    parsed.too_deep = True
    return parsed
