"""A Markdown extension (``markdown_extensions`` in mkdocs.yml) that shows doctest examples
as Python console code: in Markdown a line starting ``>>>`` is a quote, and the client's
docstrings (rendered by mkdocstrings) hold such examples."""

from __future__ import annotations

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor


class DoctestBlocks(Preprocessor):
    """Fence each run of lines that starts with ``>>>`` (up to a blank line) as ``pycon``."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fenced = False
        block: list[str] = []
        indent = ""
        for line in [*lines, ""]:
            stripped = line.lstrip()
            if block:
                if stripped:
                    block.append(line.removeprefix(indent))
                    continue
                out.extend([f"{indent}```pycon", *(indent + text for text in block)])
                out.extend([f"{indent}```", ""])
                block = []
                continue
            if stripped.startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and stripped.startswith(">>> "):
                indent = line[: len(line) - len(stripped)]
                block = [stripped]
                continue
            out.append(line)
        return out  # with one blank line more at the end, which Markdown ignores


class DoctestBlocksExtension(Extension):
    """Python-Markdown names its hooks in camelCase (extendMarkdown, makeExtension)."""

    def extendMarkdown(self, md: Markdown) -> None:
        # Before the fenced-code preprocessors (priority 25), after whitespace normalising.
        md.preprocessors.register(DoctestBlocks(md), "doctest_blocks", 28)


def makeExtension(**kwargs: object) -> DoctestBlocksExtension:
    return DoctestBlocksExtension(**kwargs)
