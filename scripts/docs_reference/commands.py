"""docs/reference/commands.md: every management command of the project's apps, with its help
and arguments, from the commands' own argument parsers."""

from __future__ import annotations

import argparse

from scripts.docs_reference.markdown import code, header, slug, table

INTRO = """
Run each as `python manage.py <command> [options]` (`.venv/bin/python manage.py …` in a
checkout). Every command also takes Django's common options (`--settings`, `--pythonpath`,
`--verbosity`, `--traceback`, `--no-color`, `--force-color`, and `--skip-checks` where it
checks the project); they are not repeated below.
"""

# The apps whose commands are the product's (Django's and third parties' are documented there).
PROJECT_APPS = ("gateway", "reconciliation", "sagas")
# Options every Django command has; the introduction names them once.
COMMON = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def project_commands() -> dict[str, str]:
    """The project's commands by name, each with the app that defines it."""
    from django.core.management import get_commands

    return {
        name: app
        for name, app in sorted(get_commands().items())
        if app.split(".")[0] in PROJECT_APPS
    }


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS, False) or action.nargs == 0:
        return ""
    return code(action.default)


def _argument(action: argparse.Action) -> list[str]:
    name = ", ".join(code(option) for option in action.option_strings) or code(action.dest)
    value = ""
    if action.choices:
        value = " | ".join(code(choice) for choice in action.choices)
    elif action.nargs != 0:
        value = code(action.metavar or action.dest.upper())
    text = (action.help or "").replace("%(default)s", str(action.default))
    if action.required and action.option_strings:
        text = f"Required. {text}"
    return [name, value, _default(action), text]


def _usage(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar if isinstance(action.metavar, str) else action.dest
    option = action.option_strings[-1]
    if action.nargs != 0:
        option += " " + (
            "{" + ",".join(map(str, action.choices)) + "}"
            if action.choices
            else str(action.metavar or action.dest.upper())
        )
    return option if action.required else f"[{option}]"


def _command(name: str, app: str) -> str:
    from django.core.management import load_command_class

    command = load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    actions = [action for action in parser._actions if action.dest not in COMMON]
    usage = " ".join(["manage.py", name, *map(_usage, actions)])
    parts = [
        f"## {name} {{#{slug(name)}}}\n",
        f"{(command.help or '').strip()}\n",
        f"App: {code(app)}.\n",
        f"```text\n{usage}\n```\n",
    ]
    if actions:
        parts.append(table(["argument", "value", "default", "meaning"], map(_argument, actions)))
    return "\n".join(parts)


def render() -> str:
    commands = project_commands()
    index = table(
        ["command", "what it does"],
        ([f"[{name}](#{slug(name)})", _summary(name, app)] for name, app in commands.items()),
    )
    body = [_command(name, app) for name, app in commands.items()]
    source = "the commands' argument parsers (`*/management/commands/`)"
    return "\n".join([header("Management commands", INTRO, source), index, *body])


def _summary(name: str, app: str) -> str:
    from django.core.management import load_command_class

    return (load_command_class(app, name).help or "").strip().split("\n")[0]
