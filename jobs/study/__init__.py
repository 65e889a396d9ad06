"""A study (jobs.pipeline): its config's schema and loading (schema.py), what tells a stage its output is up to date
(state.py), and the stages themselves (stages.py). `python -m jobs.pipeline` parses its arguments and runs them."""
