"""The evaluation of the paper's model variants (python -m jobs.evaluate): the models and data it reads (inputs.py),
Table 1 with the almost-stochastic-order test (table1.py), the exact-vs-approximate runs per layer and their
agreement (agreement.py), the tables and Fig 2-5 it writes (figures.py), and the stages in order with their
summary.json (run.py)."""
