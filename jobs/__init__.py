"""Ray entrypoints of xsbert-scale: `python -m jobs.<name>`, locally or via `ray job submit`.

    jobs.attribute   a pair dataset -> sentence factors (actor pool) -> pair cells -> Parquet store

A Python without the project's dependencies (e.g. the system `python` a `ray job submit` entrypoint gets from a
head started outside the venv) stops here with one line naming the fix, not with an ImportError deep down.
"""

from __future__ import annotations

from jobs._python import require_dependencies

require_dependencies()
