"""The machinery of `xsbert serve` and `xsbert show` (jobs/serve.py): run (opening a run, its queries), heatmap
(one stored pair), pages (the pages' queries), http (rendering and the server)."""
