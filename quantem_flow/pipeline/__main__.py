"""``python -m quantem_flow.pipeline [docs/pipelines.md ...]``: regenerate the pipeline reference.

The split of ``pipeline.py`` into this package lost the module's ``__main__``
block, so the command the docs test names failed; it lives here now.
"""

from __future__ import annotations

import sys

from .reference import write_reference


def main(argv: list[str] | None = None) -> int:
    """Regenerate the generated sections of each Markdown file named (default docs/pipelines.md)."""
    for target in (sys.argv[1:] if argv is None else argv) or ["docs/pipelines.md"]:
        print(f"{target}: {'updated' if write_reference(target) else 'up to date'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
