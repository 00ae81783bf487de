"""What a Bash command line runs, read with the standard library's ``shlex``.

``shlex`` (POSIX mode, ``punctuation_chars``) splits the line into words — quotes and
backslashes resolved as the shell does — and operators (``;`` ``&&`` ``||`` ``|`` ``&``,
redirections, parentheses, newlines). This module adds what ``shlex`` cannot see: comments,
here-documents, where ``$``, backticks, globs and braces are still live (not quoted), and
which words are shell syntax rather than a program. The rules then compare *words* (the
program's base name, its sub-commands) with sets — no pattern over the raw text, so nothing
can backtrack, and the work is linear in the line's length times ``MAX_NESTING``.

A line is *plain* when it is a sequence of simple commands separated by ``;`` ``&&`` ``||``
``|`` ``&`` and newlines. Anything else — control flow, functions, groups and subshells,
``eval``/``source``, substitutions, here-documents into a shell, brace expansion or a glob
in a command word, ``find -exec``, ``xargs`` — is reported in ``Parsed.unknown`` with the
reason, because what it runs is decided only when it runs. Text that is itself shell
(``bash -c '…'``, ``eval …``, ``$(…)``, a here-string into a shell) is read again, at most
``MAX_NESTING`` levels deep, so a governed command inside it is still found by name.

A command word that is computed when the line runs (``$(echo kube)ctl``, ``$TOOL``) is
reported as ``dynamic``: the hook refuses it rather than guess.
"""

from __future__ import annotations

import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

MAX_NESTING = 6
# What one line may cost across all its nesting levels, as a multiple of its own length: a
# line whose nested texts overlap more than this is refused as too deep (it is not plain).
WORK_FACTOR = 8
MAX_REASONS = 8

SHELLS = frozenset(
    {"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "busybox", "su", "script"}
)
# Interpreters and the options that give them their program as a string.
INTERPRETERS: dict[str, frozenset[str]] = {
    "python": frozenset({"-c"}),
    "node": frozenset({"-e", "--eval", "-p", "--print"}),
    "nodejs": frozenset({"-e", "--eval", "-p", "--print"}),
    "deno": frozenset({"eval"}),
    "bun": frozenset({"-e", "--eval", "-p", "--print"}),
    "ruby": frozenset({"-e"}),
    "perl": frozenset({"-e", "-E"}),
    "php": frozenset({"-r"}),
    "lua": frozenset({"-e"}),
    "Rscript": frozenset({"-e"}),
    "osascript": frozenset({"-e"}),
    "pwsh": frozenset({"-c", "-command"}),
    "powershell": frozenset({"-c", "-command"}),
}
_PYTHON = re.compile(r"python[0-9.]*|pypy[0-9.]*")
_PERL = re.compile(r"perl[0-9.]*")
# Programs that run another program given in their arguments, with the options of theirs that
# take a value (so the value is not taken for the program).
WRAPPERS: dict[str, frozenset[str]] = {
    "sudo": frozenset(
        {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T", "-R", "--user", "--group"}
    ),
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
    "caffeinate": frozenset({"-t", "-w"}),
    "flock": frozenset({"-w", "-E", "--timeout"}),
    "chroot": frozenset({"--userspec", "--groups"}),
    "runuser": frozenset({"-u", "-g", "-G", "--user", "--group"}),
    "parallel": frozenset({"-j", "--jobs", "-S", "-a", "--arg-file", "-d", "-I", "-n", "-N"}),
    "ssh": frozenset(
        {
            "-b",
            "-c",
            "-D",
            "-E",
            "-e",
            "-F",
            "-I",
            "-i",
            "-J",
            "-L",
            "-l",
            "-m",
            "-O",
            "-o",
            "-p",
            "-Q",
            "-R",
            "-S",
            "-W",
            "-w",
        }
    ),
}
# Wrappers whose first positional argument is theirs, not the program (timeout's duration).
_WRAPPER_POSITIONALS = {"timeout": 1, "flock": 1, "chroot": 1, "ssh": 1}
# Wrappers that join their arguments and hand them to a shell (``watch``; ``ssh`` on the
# remote host): what follows their options is shell text.
_VIA_SHELL = frozenset({"watch", "ssh"})
# Wrappers that take (part of) the command line from their input.
_FROM_INPUT = frozenset({"xargs", "parallel"})
# Reserved words that open or continue a compound command when they stand as a command word.
CONTROL = frozenset(
    {"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case",
     "esac", "select", "function", "coproc", "{", "}"}
)  # fmt: skip
_OPENERS = frozenset({"if", "for", "while", "until", "case", "select", "function", "coproc", "{"})
# Builtins that run a string or a file as shell in the current shell.
EVALUATORS = frozenset({"eval", "source", ".", "trap", "alias"})
_SHELL_TEXT = " \t\n;|&"
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})

_PUNCTUATION = "();<>|&\n"
_OPERATORS = sorted(
    ("&&", "||", ";;", ";&", "|&", "<<<", "<<-", "<<", ">>", "&>>", "&>", "<&", ">&", "<>",
     ">|", ";", "&", "|", "(", ")", "<", ">", "\n"),
    key=len,
    reverse=True,
)  # fmt: skip
_SEPARATORS = frozenset({";", "&", "&&", "||", "\n", ";;", ";&", ")"})
_PIPES = frozenset({"|", "|&"})
_REDIRECTIONS = frozenset({"<", ">", ">>", "&>", "&>>", "<&", ">&", "<>", ">|"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
_CONTINUATION = re.compile(r"(?<!\\)((?:\\\\)*)\\\n")
_ANSI_C = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|.)")
_ANSI_C_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
}
_BRACE = re.compile(r"([^{}]*)\{([^{}]*,[^{}]*)\}([^{}]*)")


@dataclass(frozen=True)
class Token:
    """A word (``value`` after quote removal, ``raw`` as written) or an operator."""

    value: str
    raw: str
    start: int
    end: int
    operator: bool = False

    @property
    def live(self) -> str:
        """The characters of ``raw`` the shell still expands: outside single quotes and not
        escaped (double quotes keep ``$`` and backticks live)."""
        return _live(self.raw)


def _live(raw: str) -> str:
    kept: list[str] = []
    quote = ""
    escaped = False
    for char in raw:
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if char == "'" else quote
        elif char == "\\":
            escaped = True
        elif char == "'" and not quote:
            quote = "'"
            kept.append("'")  # marks where a quote opened, so ``$'`` stays visible
        elif char == '"':
            quote = "" if quote else '"'
        else:
            kept.append(char)
    return "".join(kept)


def _split_operator(token: Token) -> Iterator[Token]:
    """``shlex`` returns a run of punctuation as one token (``;(``, ``)|&``): split it."""
    text = token.value
    position = 0
    while position < len(text):
        for operator in _OPERATORS:
            if text.startswith(operator, position):
                start = token.start + position
                yield Token(operator, operator, start, start + len(operator), operator=True)
                position += len(operator)
                break


class Lexer:
    """``shlex`` over the whole line, with the position of every token so the caller can
    skip a comment or a here-document body and resume after it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._stream = io.StringIO(text)
        self._lexer = self._new()

    def _new(self) -> shlex.shlex:
        lexer = shlex.shlex(self._stream, posix=True, punctuation_chars=_PUNCTUATION)
        lexer.whitespace = " \t\r"  # a newline separates commands: it is an operator here
        lexer.whitespace_split = True
        lexer.commenters = ""  # shlex starts a comment mid-word; the shell does not
        return lexer

    def _position(self) -> int:
        # shlex reads one character ahead and keeps it in a private queue when it ends a
        # word at punctuation; the next unread character is there or in the stream.
        pending = getattr(self._lexer, "_pushback_chars", ())
        return self._stream.tell() - len(pending)

    def resume_at(self, position: int) -> None:
        self._stream.seek(min(position, len(self.text)))
        self._lexer = self._new()

    def __iter__(self) -> Iterator[Token]:
        return self

    def __next__(self) -> Token:
        start = self._position()
        value = self._lexer.get_token()  # ValueError on an unclosed quote or escape
        if value is None:
            raise StopIteration
        end = self._position()
        raw = self.text[start:end]
        stripped = raw.lstrip(" \t\r")
        start += len(raw) - len(stripped)
        body = stripped[:-1]
        escaped = (len(body) - len(body.rstrip("\\"))) % 2 == 1
        if stripped[-1:] in (" ", "\t", "\r") and not escaped:
            stripped = body  # the blank that ended the word
        token = Token(value, stripped, start, start + len(stripped))
        if stripped[:1] in _PUNCTUATION and stripped:
            return Token(value, stripped, token.start, token.end, operator=True)
        return token


@dataclass(frozen=True)
class SimpleCommand:
    """One program run: its base name and its arguments (quotes resolved)."""

    program: str
    args: tuple[str, ...]
    dynamic: bool = False  # the program name itself is computed at run time
    raw_program: str = ""
    glob: bool = False  # the program name is a pattern (``kube*l``)
    dynamic_args: bool = False  # some argument is computed at run time ($VAR, $(…))
    script: str = ""  # the program text an interpreter is given (``python -c '…'``)


@dataclass(frozen=True)
class Parsed:
    commands: tuple[SimpleCommand, ...] = ()
    unknown: tuple[str, ...] = ()  # why the line is not a plain sequence of simple commands
    too_deep: bool = False


@dataclass
class _Simple:
    """The words of one simple command while it is read, with its input."""

    words: list[Token] = field(default_factory=list)
    after_pipe: bool = False
    stdin_text: str = ""  # a here-string's or here-document's text
    has_stdin_text: bool = False


@dataclass
class _Reading:
    """What one level of reading collects."""

    simple: list[_Simple] = field(default_factory=list)
    nested: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def note(self, reason: str) -> None:
        # A handful of reasons tells a human enough; the cap keeps a crafted line linear.
        if len(self.unknown) < MAX_REASONS and reason not in self.unknown:
            self.unknown.append(reason)


def _substitutions(value: str, live: str, where: str, reading: _Reading) -> None:
    """Note ``$(…)``/backticks live in ``value`` and queue the text they run."""
    if "$(" not in live and "`" not in live:
        return
    reading.note(f"command substitution in {where}: its output is known only when it runs")
    start = value.find("$(")
    while start >= 0:
        depth = 0
        for index in range(start + 1, len(value)):
            depth += {"(": 1, ")": -1}.get(value[index], 0)
            if depth == 0:
                reading.nested.append(value[start + 2 : index])
                start = value.find("$(", index)
                break
        else:
            reading.nested.append(value[start + 2 :])
            break
    reading.nested.extend(value.split("`")[1::2])


def _open_paren(previous: Token | None, current: _Simple, paren: Token, reading: _Reading) -> None:
    touching = previous is not None and previous.end == paren.start
    if touching and previous is not None and previous.value in ("<", ">"):
        reading.note("process substitution <(…)/>(…): what it runs is read only then")
    elif touching and previous is not None and not previous.operator and previous.live[-1:] == "$":
        reading.note("command substitution $(…): its output is known only when it runs")
    elif touching and previous is not None and previous.value.endswith("="):
        pass  # an array assignment, ``a=(x y)``: its words are data
    elif len(current.words) == 1:
        reading.note(f"a function definition ({current.words[0].value}() …)")
    else:
        reading.note("a subshell ( … )")


class _LineReader:
    """One pass over one line of shell text: simple commands, their input, what nests."""

    def __init__(self, text: str, reading: _Reading) -> None:
        self.lexer = Lexer(text)
        self.reading = reading
        self.current = _Simple()
        self.previous: Token | None = None
        self.expecting = ""  # the operator whose word comes next (a redirection, <<, <<<)
        self.pending: list[tuple[_Simple, Token, bool]] = []  # here-documents to read

    def run(self) -> None:
        try:
            for token in self.lexer:
                if not token.operator:
                    self._word(token)
                    self.previous = token
                    continue
                for operator in _split_operator(token):
                    self._operator(operator)
                    self.previous = operator
                    if operator.value == "\n" and self.pending:
                        self._heredoc_bodies(operator)
                        break  # the lexer resumes after the bodies
        except ValueError as exc:
            self.reading.note(f"the command cannot be read as shell ({exc})")
        self._end_command()

    def _end_command(self, *, piped: bool = False) -> None:
        if self.current.words or self.current.has_stdin_text:
            self.reading.simple.append(self.current)
        self.current = _Simple(after_pipe=piped)

    def _word(self, token: Token) -> None:
        live = token.live
        _substitutions(token.value, live, repr(token.raw[:40]), self.reading)
        expecting, self.expecting = self.expecting, ""
        if expecting == "<<<":
            self.current.stdin_text = token.value
            self.current.has_stdin_text = True
        elif expecting in ("<<", "<<-"):
            self.pending.append((self.current, token, expecting == "<<-"))
        elif expecting:
            pass  # a redirection's file: not an argument
        elif token.raw.startswith("#"):
            newline = self.lexer.text.find("\n", token.start)
            self.lexer.resume_at(len(self.lexer.text) if newline < 0 else newline)
        else:
            self.current.words.append(token)

    def _operator(self, operator: Token) -> None:
        value = operator.value
        self.expecting = ""
        if value in _SEPARATORS:
            self._end_command()
        elif value in _PIPES:
            self._end_command(piped=True)
        elif value == "(":
            _open_paren(self.previous, self.current, operator, self.reading)
            self._end_command()
        elif value in _REDIRECTIONS or value in ("<<", "<<-", "<<<"):
            previous = self.previous
            words = self.current.words
            if (
                previous is not None
                and words
                and words[-1] is previous
                and previous.end == operator.start
                and previous.raw.isdigit()
            ):
                words.pop()  # ``2>``: a file descriptor, not an argument
            self.expecting = value

    def _heredoc_bodies(self, newline: Token) -> None:
        """After the newline ending a line with ``<<WORD``: read each body, resume after."""
        text = self.lexer.text
        position = newline.end
        for simple, delimiter, strip_tabs in self.pending:
            body_start = position
            body_end = len(text)
            while position < len(text):
                line_end = text.find("\n", position)
                line_end = len(text) if line_end < 0 else line_end
                line = text[position:line_end]
                if (line.lstrip("\t") if strip_tabs else line) == delimiter.value:
                    body_end = position
                    position = line_end + 1
                    break
                position = line_end + 1
            simple.stdin_text = text[body_start:body_end]
            simple.has_stdin_text = True
            if delimiter.raw == delimiter.value:  # unquoted: the body's substitutions run
                body = simple.stdin_text
                _substitutions(body, body, "a here-document", self.reading)
        self.pending.clear()
        self.lexer.resume_at(position)


def _command_position(words: list[Token], reading: _Reading) -> int:
    """Index of the command word: assignments, ``!`` and reserved words come before it."""
    index = 0
    while index < len(words):
        raw = words[index].raw
        if raw in CONTROL:
            if raw in _OPENERS:
                reading.note(f"control flow ({raw} …): what runs is decided only when it runs")
        elif raw == "-p" and index and words[index - 1].raw == "time":
            pass  # the ``time`` keyword's one option
        elif not (raw in ("!", "time") or _ASSIGNMENT.match(raw)):
            break  # ``!`` and ``time`` are keywords before any pipeline, compound ones too
        index += 1
    return index


def _program_word(word: Token, reading: _Reading) -> tuple[list[str], bool]:
    """The command word as the words it becomes (brace expansion makes several), and
    whether it is a glob pattern."""
    live = word.live
    value = _value(word)
    if "$'" in live:
        reading.note(f"ANSI-C quoting in the command word {word.raw[:40]!r}")
    brace = _BRACE.fullmatch(value) if "{" in live and "}" in live else None
    if brace is not None:
        reading.note(f"brace expansion in the command word {word.raw[:40]!r}")
        prefix, middle, suffix = brace.groups()
        return [f"{prefix}{part}{suffix}" for part in middle.split(",")], False
    glob = value not in ("[", "[[") and any(char in live for char in "*?[")  # ``[`` is test
    if glob:
        reading.note(
            f"a pattern in the command word {word.raw[:40]!r}: the file it runs is found then"
        )
    return [value], glob


def _value(word: Token) -> str:
    """The word's value, with ``$'…'`` (ANSI-C quoting, which shlex reads as ``$`` and the
    quoted text) decoded the way the shell decodes it, near enough to compare names."""
    if "$'" not in word.live:
        return word.value
    return _ANSI_C.sub(_ansi_c_char, word.value.replace("$", ""))


def _ansi_c_char(match: re.Match[str]) -> str:
    code = match.group(1)
    if code[0] in "xuU" and len(code) > 1:
        return chr(min(int(code[1:], 16), 0x10FFFF))
    if code[0].isdigit():
        return chr(int(code, 8))
    return _ANSI_C_SIMPLE.get(code, code)


def _computed(word: Token) -> bool:
    """Whether the shell computes the word when it runs: ``$`` (other than ``$'…'``, which
    is quoting) or a backtick outside single quotes."""
    live = word.live.replace("$'", "'")
    return "$" in live or "`" in live


def _as_shell_text(value: str) -> str:
    """A word's value read again as shell. Inside double quotes shlex keeps the backslash
    before a dollar sign or a backtick, where the shell drops it; dropping it everywhere errs
    on the side of finding a substitution (in single quotes the backslash was literal)."""
    return value.replace("\\$", "$").replace("\\`", "`")


def _shell(name: str, args: list[str], simple: _Simple, reading: _Reading) -> None:
    """A shell runs ``-c`` text, a script file, or what comes on its input."""
    for position, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]:
            if position + 1 < len(args):
                reading.nested.append(_as_shell_text(args[position + 1]))
            return
    if any(not arg.startswith("-") for arg in args) and "-s" not in args:
        return  # a script file: it runs like any program
    if simple.has_stdin_text:
        reading.note(f"a here-document or here-string into {name}")
        reading.nested.append(_as_shell_text(simple.stdin_text))
    elif simple.after_pipe:
        reading.note(f"text piped into {name}: what it runs is known only then")


def _interpreter(name: str, args: list[str], simple: _Simple, reading: _Reading) -> str:
    """The program text an interpreter runs (``-c``/``-e`` or its input), or ''."""
    key = "python" if _PYTHON.fullmatch(name) else "perl" if _PERL.fullmatch(name) else name
    flags = INTERPRETERS[key]
    for position, arg in enumerate(args):
        code_flag = arg in flags or any(
            len(flag) == 2 and arg[:1] == "-" and arg[1:2] != "-" and arg.endswith(flag[1])
            for flag in flags
        )
        if code_flag and position + 1 < len(args):
            return args[position + 1]
        if key == "python" and arg.startswith("-c") and len(arg) > 2:
            return arg[2:]
        if not arg.startswith("-") or arg == "-":
            if arg != "-":
                return ""  # a script file
            break
    if simple.has_stdin_text:
        reading.note(f"a here-document or here-string into {name}")
        return simple.stdin_text
    if simple.after_pipe:
        reading.note(f"text piped into {name}: what it runs is known only then")
    return ""


def _skip_wrapper(name: str, words: list[Token], index: int, reading: _Reading) -> int:
    """Index of the program a wrapper runs (``sudo -u x kubectl``), after its options."""
    takes_value = WRAPPERS[name]
    positionals = _WRAPPER_POSITIONALS.get(name, 0)
    if name in _FROM_INPUT:
        reading.note(f"{name} builds its command line from its input")
    while index < len(words):
        text = words[index].value
        if name == "env" and text in ("-S", "--split-string") and index + 1 < len(words):
            reading.nested.append(_as_shell_text(" ".join(w.value for w in words[index + 1 :])))
            return len(words)
        if name in _VIA_SHELL and not text.startswith("-") and not positionals:
            reading.nested.append(_as_shell_text(" ".join(w.value for w in words[index:])))
            return len(words)
        if any(char in text for char in _SHELL_TEXT):
            break  # a command line in one word: read again as shell (below)
        if text.startswith("-") and text != "-":
            index += 2 if text in takes_value else 1
        elif _ASSIGNMENT.match(text):
            index += 1  # env and sudo take NAME=value before the program
        elif positionals:
            positionals -= 1
            index += 1
        else:
            break
    return index


def _find_exec(args: list[str], reading: _Reading) -> list[list[str]]:
    """The commands ``find -exec … ;`` runs, one word list each."""
    runs: list[list[str]] = []
    index = 0
    while index < len(args):
        if args[index] in _FIND_EXEC:
            reading.note(f"find {args[index]} runs a command for each file it finds")
            end = index + 1
            while end < len(args) and args[end] not in (";", "+"):
                end += 1
            runs.append(args[index + 1 : end])
            index = end
        index += 1
    return runs


def _quoted(value: str, like: Token) -> Token:
    return Token(value, shlex.quote(value), like.start, like.end)


def _run_by(name: str, args: list[str], simple: _Simple, reading: _Reading) -> str:
    """What a shell, an interpreter or an evaluator is given to run; an interpreter's
    program text is returned (the policy reads it), shell text is queued to be read."""
    if name in SHELLS:
        _shell(name, args, simple, reading)
    elif name in INTERPRETERS or _PYTHON.fullmatch(name) or _PERL.fullmatch(name):
        return _interpreter(name, args, simple, reading)
    elif name in EVALUATORS:
        what = "a file's commands" if name in ("source", ".") else "its arguments as shell"
        reading.note(f"{name} runs {what} in this shell")
        if name == "alias":
            reading.nested.extend(arg.partition("=")[2] for arg in args)
        elif name == "eval":
            reading.nested.append(_as_shell_text(" ".join(args)))
        elif name == "trap" and args:
            reading.nested.append(_as_shell_text(args[0]))
    elif name == "find":
        for run in _find_exec(args, reading):
            reading.nested.append(" ".join(shlex.quote(word) for word in run))
    return ""


def _unwrap(words: list[Token], simple: _Simple, reading: _Reading) -> SimpleCommand | None:
    """The program a simple command runs, through assignments, reserved words and wrappers
    (sudo, env, timeout…); what it runs in turn (``bash -c``, ``eval``) is queued."""
    words = words[_command_position(words, reading) :]
    index = 0
    wrapped = False
    while index < len(words):
        word = words[index]
        if _computed(word):
            rest = tuple(w.value for w in words[index + 1 :])
            name = word.value.rsplit("/", 1)[-1]
            raw = f"{word.raw}(…)" if word.raw.endswith("$") else word.raw  # ``$(`` split by shlex
            return SimpleCommand(name, rest, dynamic=True, raw_program=raw)
        expanded, glob = _program_word(word, reading)
        if expanded != [word.value]:
            words = [*words[:index], *(_quoted(v, word) for v in expanded), *words[index + 1 :]]
            word = words[index]
        name = word.value.rsplit("/", 1)[-1]
        if name in WRAPPERS and not glob:
            index = _skip_wrapper(name, words, index + 1, reading)
            wrapped = True
            continue
        args = [_value(w) for w in words[index + 1 :]]
        if wrapped and any(char in word.value for char in _SHELL_TEXT):
            # watch and the like run it with sh -c
            reading.nested.append(_as_shell_text(" ".join([word.value, *args])))
            return None
        script = _run_by(name, args, simple, reading)
        return SimpleCommand(
            name,
            tuple(args),
            raw_program=word.raw,
            glob=glob,
            dynamic_args=any(_computed(w) for w in words[index + 1 :]),
            script=script,
        )
    return None


@lru_cache(maxsize=128)
def parse(text: str) -> Parsed:
    """Every simple command ``text`` runs, nested ones included, and why it is not plain."""
    commands: list[SimpleCommand] = []
    unknown: list[str] = []
    budget = WORK_FACTOR * max(len(text), 256)
    level = [text]
    for _ in range(MAX_NESTING + 1):
        deeper: list[str] = []
        for piece in level:
            budget -= len(piece)
            if budget < 0:
                return Parsed(tuple(commands), tuple(unknown), too_deep=True)
            reading = _Reading()
            _LineReader(_CONTINUATION.sub(r"\1", piece), reading).run()
            for simple in reading.simple:
                command = _unwrap(simple.words, simple, reading)
                if command is not None:
                    commands.append(command)
            unknown.extend(
                r for r in reading.unknown if r not in unknown and len(unknown) < MAX_REASONS
            )
            deeper.extend(reading.nested)
        if not deeper:
            return Parsed(tuple(commands), tuple(unknown))
        level = deeper
    return Parsed(tuple(commands), tuple(unknown), too_deep=True)
