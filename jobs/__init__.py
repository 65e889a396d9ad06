"""Ray entrypoints of xsbert-scale: `python -m jobs.<name>`, locally or via `ray job submit`.

    jobs.attribute   a pair dataset -> sentence factors (actor pool) -> pair cells -> Parquet store
"""
