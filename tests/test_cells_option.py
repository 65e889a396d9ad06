"""`jobs.attribute --cells all|same-token|none`: which cells a run stores (docs/STORE.md).

The same real STS-B pairs are attributed three times with all-MiniLM-L6-v2 (last layer, N = 2; --executor local, no
Ray) and once more with --cells same-token on the local Ray: the same-token store must hold exactly the full store's
cells with token_a = token_b (and word cells with word_a = word_b), row for row, every column; its pairs the same
sums, ranks and top cells; `sql/lexical_ranks.sql` the same table on both; the analyses that need every cell stop
with one line on it, and jobs.report skips them with that reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from jobtools import FAST, q, rows, stsb_rows, write_tsv

from jobs import sqlrun
from jobs import store as jstore

ROOT = Path(__file__).resolve().parents[1]
N_PAIRS = 8
# The pairs columns that count the stored cells (everything else is over every cell).
COUNTS = ("n_cells", "n_word_cells")


def run_local(out: Path, data: Path, *flags: str) -> dict:
    from jobs.attribute import main, parse_args

    return main(parse_args([*FAST, "--dataset", str(data), "--wave-size", "4", "--executor", "local", *flags,
                            "--out", str(out), "--quiet"]))  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """cells choice -> its run directory, the same 8 pairs attributed with each."""
    root = tmp_path_factory.mktemp("cells")
    data = write_tsv(root / "pairs.tsv", stsb_rows(N_PAIRS, start=20))
    out: dict[str, Path] = {"data": data}
    for choice in ("all", "same-token", "none"):
        flags = () if choice == "all" else ("--cells", choice)
        out[choice] = Path(run_local(root / "runs", data, *flags)["run_dir"])
    return out


def test_cells_is_part_of_the_run_id_only_when_not_all():
    from jobs.attribute import parse_args, settings
    from jobs.attribution.prepare import run_config
    from jobs.attribution.validate import load_pairs

    class FakeExplainer:
        settings = {"model": "m", "layer": 3, "n_layers": 6, "mode": "approx", "similarity": "cos",
                    "rule": "gauss-legendre", "steps": 16, "tolerance": None, "max_steps": None}  # fmt: skip

    pairs = load_pairs("stsb", split="test", limit=3)

    def config(*flags: str) -> dict:
        return run_config(settings(["--dataset", "stsb", *flags]).attribution, FakeExplainer(), "w" * 64, pairs)

    base = config()
    assert "cells" not in base and config("--cells", "all") == base  # the run ids of earlier stores stand
    ids = {jstore.run_id(base), jstore.run_id(config("--cells", "same-token")), jstore.run_id(config("--cells", "none"))}
    assert len(ids) == 3
    assert config("--cells", "none")["cells"] == "none"
    with pytest.raises(SystemExit):
        parse_args(["--dataset", "stsb", "--cells", "some"])


def test_the_same_token_store_holds_the_full_runs_same_token_cells(stores):
    full, same, none = stores["all"], stores["same-token"], stores["none"]
    assert len({full.name, same.name, none.name}) == 3
    for run, choice in ((full, "all"), (same, "same-token"), (none, "none")):
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["cells"] == choice and manifest["config"].get("cells", "all") == choice
    # Row for row, every column (ranks among all the pair's cells included).
    cells = rows(full, "cells")
    same_cells = [r for r in cells if r[3] == r[4]]  # token_a = token_b
    assert rows(same, "cells") == same_cells and 0 < len(same_cells) < len(cells) / 4
    words = rows(full, "word_cells")
    same_words = [r for r in words if r[3] == r[4]]  # word_a = word_b
    assert rows(same, "word_cells") == same_words and 0 < len(same_words) < len(words)
    assert rows(none, "cells") == [] and rows(none, "word_cells") == []
    # The pairs: the same numbers, sums, top cells; only the counts of stored cells differ.
    columns = [f.name for f in jstore.SCHEMAS["pairs"] if f.name not in COUNTS]
    select = f"select {', '.join(columns)} from {{pairs}} order by pair_id"
    assert q(same, select) == q(full, select) == q(none, select)
    counted = "select pair_id, n_cells, n_word_cells from {pairs} order by pair_id"
    assert q(same, counted) == q(full, """
        select pair_id, count(*) filter (where token_a = token_b),
               (select count(*) from {word_cells} w where w.pair_id = c.pair_id and w.word_a = w.word_b)
        from {cells} c group by pair_id order by pair_id""")  # fmt: skip
    assert {r[1:] for r in q(none, counted)} == {(0, 0)}
    for table in ("sentences", "quarantine"):
        assert rows(same, table) == rows(full, table) == rows(none, table), table
    # The cells still sum to the stored attribution_sum in the full run (the sums are over every cell).
    assert q(full, """select max(abs(p.attribution_sum - c.total)) < 1e-9 from {pairs} p
                      join (select pair_id, sum(value) as total from {cells} group by pair_id) c using (pair_id)""") \
        == [(True,)]  # fmt: skip


@pytest.mark.parametrize("include_special", [True, False])
def test_lexical_ranks_are_the_same_table_on_both_stores(stores, include_special):
    variables = {"min_count": 2, "include_special": include_special}
    full = sqlrun.run_file(sqlrun.connect(stores["all"], variables=variables), "lexical_ranks")
    same = sqlrun.run_file(sqlrun.connect(stores["same-token"], variables=variables), "lexical_ranks")
    # The same rows; mean and std equal up to the order DuckDB sums in (its threads split the two tables apart).
    assert full.height > 3 and full.select("token", "n", "rank").equals(same.select("token", "n", "rank"))
    for col in ("mean", "std"):
        assert np.allclose(full[col].to_numpy(), same[col].to_numpy(), rtol=1e-12, atol=0), col
    pair = sqlrun.run_file(sqlrun.connect(stores["all"], stores["same-token"], variables), "lexical_ranks_compare")
    assert pair.height == full.height and pair["spearman"].to_list() == [1.0] * pair.height


def test_analyses_that_need_other_cells_stop_with_one_line(stores, capsys):
    from jobs.cli import main as xsbert

    full, same, none = (str(stores[k]) for k in ("all", "same-token", "none"))
    cases = [
        (["--run", same, "--file", "negation"], f"negation.sql needs every cell; run {same} stores --cells "
                                                "same-token (attribute it with --cells all)"),
        (["--run", full, "--file", "negation_signs", "--var", f"other_runs={same}"],
         f"negation_signs.sql needs every cell; run {same} stores --cells same-token"),
        (["--run", full, "--run2", same, "--file", "agreement"], f"agreement.sql needs every cell of both runs; run "
                                                                 f"{same} stores --cells same-token"),
        (["--run", none, "--file", "lexical_ranks"], f"lexical_ranks.sql needs the same-token cells; run {none} "
                                                     "stores --cells none (attribute it with --cells same-token or all)"),
        (["--run", full, "--run2", none, "--file", "lexical_ranks_compare"], "lexical_ranks_compare.sql needs"),
    ]  # fmt: skip
    for argv, message in cases:
        code = xsbert(["sql", *argv])
        captured = capsys.readouterr()
        assert code == 2 and not captured.out, argv
        err = captured.err.strip()
        assert len(err.splitlines()) == 1 and message in err, (argv, err)
    # The duckdb CLI, exactly as a file's header runs it, stops with the same line.
    cli = Path(sys.executable).parent / "duckdb"
    shown = subprocess.run([str(cli), "-cmd", f"set variable run = '{same}'", "-f", "sql/negation.sql"], cwd=ROOT,
                           capture_output=True, text=True)  # fmt: skip
    assert shown.returncode != 0 and "negation.sql needs every cell" in shown.stderr + shown.stdout
    # The full store answers them all (no guard fires on a run of every cell).
    assert sqlrun.run_file(sqlrun.connect(full), "negation").height == 0  # STS-B: no pair differs by one 'not'
    assert sqlrun.run_file(sqlrun.connect(full), "negation_signs").height == 0
    assert sqlrun.run_file(sqlrun.connect(full, full), "agreement").height > 0


def test_guards_of_the_word_cell_files_on_runs_they_otherwise_fit(stores, tmp_path):
    """adjectives.sql and syntactic_relations.sql need a triplet column / a parses table too: given those, the
    guard is what stops them on a same-token run, and not on a full one."""
    import shutil

    import pyarrow.parquet as pq
    from jobtools import add_adjective_columns

    for choice in ("all", "same-token"):
        run = tmp_path / choice
        shutil.copytree(stores[choice], run)
        add_adjective_columns(run)  # adjectives.sql reads the triplet columns of pairs
        parses = jstore.SCHEMAS["parses"].empty_table()
        (run / "parses").mkdir()
        pq.write_table(parses, run / "parses" / "part-000000.parquet")
        for name in ("adjectives", "syntactic_relations", "syntactic_relations_pairs"):
            con = sqlrun.connect(run)
            if choice == "all":
                sqlrun.run_file(con, name)
            else:
                with pytest.raises(Exception, match=f"{name}.sql needs every word cell"):
                    sqlrun.run_file(con, name)


def test_the_report_of_a_same_token_run_ranks_tokens_and_skips_the_rest(stores, tmp_path):
    from jobs import report

    summary = report.main(report.parse_args(["--run", str(stores["same-token"]), "--out", str(tmp_path / "rep"),
                                             "--var", "min_count=2", "-q"]))  # fmt: skip
    sections = {s.name: s for s in summary["sections"]}
    assert sections["lexical_ranks"].status == "ok" and sections["table1"].status == "ok"
    for name in ("negation", "negation_signs", "adjectives", "syntactic_relations", "syntactic_relations_pairs",
                 "examples"):
        assert sections[name].status == "skipped" and "--cells same-token" in sections[name].reason, name


def test_a_ray_run_of_same_token_cells_equals_the_local_one(ray_cluster, stores, tmp_path):
    from jobtools import run_job

    s = run_job(tmp_path / "ray", "--dataset", str(stores["data"]), "--wave-size", "4", "--cells", "same-token")
    assert Path(s["run_dir"]).name == stores["same-token"].name
    for table in ("pairs", "cells", "word_cells", "sentences", "quarantine"):
        assert rows(Path(s["run_dir"]), table) == rows(stores["same-token"], table), table


def test_pair_cells_rejects_an_unknown_choice():
    from jobs.attribution.actors import PairCells

    with pytest.raises(ValueError, match="cells must be one of all, same-token, none"):
        PairCells([], "cos", cells="some")
