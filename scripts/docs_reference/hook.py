"""The MkDocs hook (``hooks:`` in mkdocs.yml) that adds the generated reference pages to the
site at build time. Nothing is written into docs/: the pages exist only in the build."""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

# The checkout this hook belongs to comes first on the path: its code is the code documented
# (a shared virtualenv may have the project installed from another checkout).
ROOT = Path(__file__).resolve().parents[2]
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

from scripts.docs_reference import render_all  # noqa: E402


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path, markdown in render_all().items():
        if files.get_file_from_path(path) is not None:
            raise PluginError(f"docs/{path} is generated from the code: delete the file")
        files.append(File.generated(config, path, content=markdown))
    return files
