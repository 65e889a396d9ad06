"""The attribution job (`python -m jobs.attribute`): inputs, store, and real runs on a local 2-CPU Ray.

Unit tests (no Ray) cover dataset reading, column recognition, validation, run ids, atomic commits and
stages 1 + 2 against the independent implementation (tests/independent.py). The Ray tests share one
local cluster (ray.init(num_cpus=2)) and run the job in-process on a few real STS-B pairs with
all-MiniLM-L6-v2 at its last layer and N = 2 (cheap; the numbers are checked against `xsbert explain`
with the same settings), then read the Parquet store back with DuckDB. Killed workers and drivers,
the retry bound and duplicates: tests/test_job_faults.py; the other options and inputs:
tests/test_job_paths.py; GPU actors: tests/test_job_gpu.py.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobtools import FAST, FAST_ENGINE, ROOT, TABLES, run_job, stsb_rows, write_tsv

from jobs import store as jstore
from jobs.attribution import inputs as _inputs
from jobs.attribution.inputs import resolve_source
from jobs.attribution.validate import load_pairs, validate
from xsbert_core import EngineSettings, InputError


# --------------------------------------------------------------------------- helpers
def duck():
    import duckdb

    return duckdb.connect()


def q(run_dir: Path, sql: str) -> list[tuple]:
    """Run `sql` with {pairs}, {cells}, ... replaced by read_parquet of the run's tables."""
    tables = {t: f"read_parquet('{run_dir}/{t}/*.parquet')" for t in TABLES}
    return duck().execute(sql.format(**tables)).fetchall()


def file_hashes(run_dir: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}  # fmt: skip


# --------------------------------------------------------------------------- inputs (no Ray)
def test_builtin_stsb_is_bundled_with_unique_ids():
    pairs = load_pairs("stsb", split="test")
    assert pairs.source.location == str(_inputs.BUNDLED_STSB) and _inputs.BUNDLED_STSB.exists()
    assert len(pairs.rows) == 1379
    assert pairs.rows.pair_id.is_unique  # sid alone repeats; source_file:year:sid does not
    assert pairs.rows.pair_id.iat[0] == "MSRvid:2012test:0024"
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert len(good) == 1379 and quarantine.empty
    assert good.label.between(0, 5).all()
    assert len(load_pairs("stsb", split="validation").rows) == 1500  # alias of dev
    with pytest.raises(InputError):
        load_pairs("stsb", split="nope")


def test_builtin_qqp_from_a_path(tmp_path, monkeypatch):
    path = tmp_path / "qqp.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n")
        fh.write('133273\t1\t2\tHow do I "learn" Python?\tWhat is the best way to learn Python?\t1\n')
        fh.write("18\t3\t4\tWhy is the sky blue?\tWhat is a cat?\t0\n")
        fh.write("19\t5\t6\tIs it good?\tIs it bad?\t2\n")
    monkeypatch.setenv("XSBERT_QQP", str(path))
    pairs = load_pairs("qqp")
    assert pairs.source.identity == "qqp" and pairs.columns.ids == ("id",)
    assert pairs.rows.pair_id.tolist() == ["133273", "18", "19"]
    assert pairs.rows.text_a.iat[0] == 'How do I "learn" Python?'  # no quoting in TSV
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert good.label.tolist() == [1.0, 0.0]
    assert quarantine.reason.tolist() == ["bad_label"]  # is_duplicate must be 0 or 1
    # --qqp-path wins over the environment
    assert load_pairs("qqp", qqp=str(path)).source.location == str(path)
    monkeypatch.setenv("XSBERT_QQP", str(tmp_path / "missing.tsv.gz"))
    with pytest.raises(InputError, match="does not exist"):
        load_pairs("qqp")


def test_qqp_without_the_subset_goes_to_the_hub_and_says_how_to_get_it(monkeypatch):
    monkeypatch.delenv("XSBERT_QQP", raising=False)
    source = resolve_source("qqp", split="validation")  # the subset is train only
    assert (source.kind, source.location, source.config, source.split) == ("hub", "glue", "qqp", "validation")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(InputError, match="network"):
        load_pairs("qqp", split="validation")


def test_qqp_with_neither_path_nor_variable_is_the_hubs_glue_qqp(monkeypatch):
    """No default location outside the repository: without --qqp-path and $XSBERT_QQP, `qqp` is GLUE's QQP."""
    monkeypatch.delenv("XSBERT_QQP", raising=False)
    source = resolve_source("qqp")
    assert (source.kind, source.location, source.config, source.split) == ("hub", "glue", "qqp", "train")
    from jobs.attribution.inputs import require_qqp

    with pytest.raises(InputError, match=r"bench/x.py needs a QQP subset file .*--qqp-path FILE or set \$XSBERT_QQP"):
        require_qqp(None, "bench/x.py")


def test_hub_names_and_configs_resolve():
    assert (resolve_source("glue/qqp").location, resolve_source("glue/qqp").config) == ("glue", "qqp")
    s = resolve_source("sentence-transformers/stsb", split="test")
    assert (s.kind, s.location, s.config, s.split) == ("hub", "sentence-transformers/stsb", None, "test")
    assert resolve_source("nyu-mll/glue:qqp").config == "qqp"
    assert resolve_source("nyu-mll/glue", config="mrpc").config == "mrpc"


def test_hub_code_path_through_a_local_datasets_folder(tmp_path):
    # The same `datasets.load_dataset` call that reads a hub name reads a local dataset folder.
    folder = tmp_path / "mydata"
    folder.mkdir()
    (folder / "train.csv").write_text("sentence1,sentence2,score\nX y.,Z w.,3.0\n", encoding="utf-8")
    (folder / "test.csv").write_text("sentence1,sentence2,score\nA b.,C d.,1.5\nE f.,G h.,2.0\n", encoding="utf-8")
    pairs = load_pairs(str(folder), split="test")
    assert pairs.source.kind == "hub-folder"
    assert pairs.rows.pair_id.tolist() == ["0", "1"]  # no id column: row numbers
    assert pairs.rows.text_b.tolist() == ["C d.", "G h."]
    with pytest.raises(InputError, match="choose one with --split"):
        load_pairs(str(folder))


def test_a_csv_folder_keeps_each_field_as_its_text_as_a_file_does(tmp_path):
    """`datasets` reads a folder's CSV/TSV with pandas, whose default turned `nan`, `NA` and `null` into no value: a
    label `nan` became a pair without a label (kept), where the same file given directly has it as a bad label
    (quarantined), and a text `null` became an empty text. keep_default_na=False: the folder reads as the file."""
    rows = "sentence1\tsentence2\tscore\nA b.\tC d.\tnan\nE f.\tnull\t2.0\nI j.\tK l.\tNA\nM n.\tO p.\t\n"
    for name in ("folder", "tsv-folder"):
        (tmp_path / name).mkdir()
    (tmp_path / "folder" / "test.csv").write_text(rows.replace("\t", ","), encoding="utf-8")
    (tmp_path / "tsv-folder" / "test.tsv").write_text(rows, encoding="utf-8")
    (tmp_path / "file.tsv").write_text(rows, encoding="utf-8")
    want = load_pairs(str(tmp_path / "file.tsv")).rows
    assert want.label_raw.tolist() == ["nan", "2.0", "NA", ""] and want.text_b.tolist()[1] == "null"
    for name in ("folder", "tsv-folder"):
        got = load_pairs(str(tmp_path / name), split="test").rows
        assert got[["text_a", "text_b", "label_raw"]].equals(want[["text_a", "text_b", "label_raw"]]), (name, got)
    assert _inputs._folder_options(resolve_source(str(tmp_path / "folder"))) == {"keep_default_na": False}
    (tmp_path / "pq").mkdir()  # a folder of Parquet (or JSON) files has its types: nothing for pandas to guess
    assert _inputs._folder_options(resolve_source(str(tmp_path / "pq"))) == {}


def test_the_console_prints_a_warning_of_huggingface_hub_once():
    """huggingface_hub has a handler of its own and passed its records on to the console's too: each retried request
    of the hub client printed two lines."""
    code = ("import logging, huggingface_hub; from jobs.console import quiet_console; quiet_console(); "
            "logging.getLogger('huggingface_hub.utils._http').warning('Retrying in 1s [Retry 1/5].')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr.count("Retrying in 1s") == 1, proc.stderr


def test_the_quiet_console_hides_the_datasets_bar_of_a_folder(tmp_path):
    """`datasets` draws "Generating test split: ..." while it reads a folder: off a TTY, or with -q, the job's
    console (jobs/console.py quiet_console) has it off, whether `datasets` is imported before or after."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "test.csv").write_text("sentence1,sentence2,score\nA b.,C d.,1.0\n", encoding="utf-8")
    code = ("import sys; {before}from jobs.console import quiet_console; quiet_console(); "
            "from jobs.attribution.validate import load_pairs; print(len(load_pairs(sys.argv[1], split='test').rows))")
    for before in ("", "import datasets; "):
        proc = subprocess.run([sys.executable, "-c", code.format(before=before), str(tmp_path / "d")], cwd=ROOT,
                              capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr[-2000:]
        assert "Generating" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("fmt", ["tsv", "tsv.gz", "csv", "csv.gz", "parquet", "jsonl", "jsonl.gz"])
def test_every_file_format_reads_the_same_rows(tmp_path, fmt):
    df = pd.DataFrame({"pair_id": ["a", "b", "c"], "text_a": ["He said \"hi\".", "x, y", "ümlaut"],
                       "text_b": ["One.", "Two.", "Three."], "label": ["1", "0.5", "0"]})  # fmt: skip
    path = tmp_path / f"pairs.{fmt}"
    base = fmt.replace(".gz", "")
    if base == "tsv":
        text = "\n".join(["\t".join(df.columns)] + ["\t".join(r) for r in df.itertuples(index=False)]) + "\n"
    elif base == "csv":
        text = df.to_csv(index=False)
    elif base == "jsonl":
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in df.to_dict("records"))
    if base == "parquet":
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path)
    elif fmt.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    pairs = load_pairs(str(path))
    assert pairs.columns.as_dict() == {"text_a": "text_a", "text_b": "text_b", "label": "label", "id": ["pair_id"]}
    assert pairs.rows.pair_id.tolist() == ["a", "b", "c"]
    assert pairs.rows.text_a.tolist() == df.text_a.tolist()
    good, _ = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert good.label.tolist() == [1.0, 0.5, 0.0]


def test_column_recognition_and_flags(tmp_path):
    path = write_tsv(tmp_path / "q.tsv", pd.DataFrame({"Question1": ["a?"], "question2": ["b?"], "is_duplicate": ["1"],
                                                        "sid": ["7"], "extra": ["x"]}))  # fmt: skip
    cols = load_pairs(str(path)).columns
    assert (cols.text_a, cols.text_b, cols.label, cols.ids) == ("Question1", "question2", "is_duplicate", ("sid",))
    pairs = load_pairs(str(path), text_a="extra", label="none", ids="none")
    assert (pairs.columns.text_a, pairs.columns.label, pairs.columns.ids) == ("extra", None, ())
    assert pairs.rows.pair_id.tolist() == ["0"]
    assert load_pairs(str(path), ids="sid,extra").rows.pair_id.tolist() == ["7:x"]
    with pytest.raises(InputError, match="no such column"):
        load_pairs(str(path), text_b="nope")
    bad = write_tsv(tmp_path / "bad.tsv", pd.DataFrame({"foo": ["a"], "bar": ["b"]}))
    with pytest.raises(InputError, match="--text-a-column"):
        load_pairs(str(bad))


@pytest.mark.parametrize("fmt", ["tsv", "csv", "parquet", "jsonl"])
def test_duplicate_column_names_are_one_clear_error(tmp_path, fmt):
    """Two columns of one name (or of names that differ only in case: columns are matched ignoring case) are one
    InputError naming it and both positions; before, the last one won silently."""
    path = tmp_path / f"dup.{fmt}"
    names = ["id", "sentence1", "sentence2", "Score", "score"]
    row = ["a", "One.", "Two.", "1", "5"]
    if fmt == "tsv":
        path.write_text("\t".join(names) + "\n" + "\t".join(row) + "\n", encoding="utf-8")
    elif fmt == "csv":
        path.write_text(",".join(names) + "\n" + ",".join(row) + "\n", encoding="utf-8")
    elif fmt == "parquet":
        pq.write_table(pa.table([pa.array([v]) for v in row], names=names), path)
    else:
        path.write_text('{"id": "a", "sentence1": "One.", "sentence2": "Two.", "score": 1, "score": 5}\n',
                        encoding="utf-8")  # fmt: skip
    with pytest.raises(InputError) as info:
        load_pairs(str(path))
    message = str(info.value)
    assert "\n" not in message and "'score' appears" in message and str(path) in message, message
    assert ("columns 4 and 5" in message) if fmt != "jsonl" else ("line 1" in message and "columns 4 and 5" in message)


@pytest.mark.parametrize("fmt", ["tsv.gz", "jsonl.gz", "parquet"])
def test_a_broken_or_mislabelled_file_is_one_clear_error(tmp_path, fmt):
    """A file cut short (a copy that stopped half-way) or not what its name says is one InputError naming the file
    and what it could not be read as; they were tracebacks (EOFError, BadGzipFile, ArrowInvalid)."""
    df = pd.DataFrame({"sentence1": [f"Sentence {k}." for k in range(2000)], "sentence2": ["Another."] * 2000})
    whole = tmp_path / f"whole.{fmt}"
    if fmt == "parquet":
        df.to_parquet(whole)
    elif fmt == "tsv.gz":
        df.to_csv(whole, sep="\t", index=False)
    else:
        df.to_json(whole, orient="records", lines=True)
    assert len(load_pairs(str(whole)).rows) == 2000
    data = whole.read_bytes()
    cut, plain = tmp_path / f"cut.{fmt}", tmp_path / f"plain.{fmt}"
    cut.write_bytes(data[: len(data) // 2])
    plain.write_text("sentence1\tsentence2\nOne.\tTwo.\n", encoding="utf-8")  # no gzip, no Parquet
    kind = {"tsv.gz": "TSV, gzip-compressed", "jsonl.gz": "JSONL, gzip-compressed", "parquet": "Parquet"}[fmt]
    for path in (cut, plain):
        with pytest.raises(InputError) as info:
            load_pairs(str(path))
        assert str(info.value).startswith(f"{path}: cannot be read as {kind} (") and "\n" not in str(info.value)


def test_a_dataset_path_that_is_not_a_file_says_what_it_is(tmp_path):
    """A FIFO, a device or a loop of symbolic links exists: the error says what it is, not 'no such file or
    folder' (before); a link to nothing says that."""
    fifo = tmp_path / "pairs.tsv"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.tsv"
    loop.symlink_to(tmp_path / "loop2.tsv")
    (tmp_path / "loop2.tsv").symlink_to(loop)
    dangling = tmp_path / "gone.tsv"
    dangling.symlink_to(tmp_path / "never-there.tsv")
    for path, want in ((fifo, "a named pipe (FIFO), not a file"), ("/dev/zero", "a character device, not a file"),
                       (loop, "a loop of symbolic links"), (dangling, "a symbolic link to nothing")):  # fmt: skip
        with pytest.raises(InputError) as info:
            resolve_source(str(path))
        assert want in str(info.value) and "no such file" not in str(info.value), str(info.value)
    with pytest.raises(InputError, match="no such file or folder"):
        resolve_source(str(tmp_path / "missing.tsv"))


def test_sample_is_seeded_and_limit_takes_the_first(tmp_path):
    a = load_pairs("stsb", sample=50, seed=1).rows
    b = load_pairs("stsb", sample=50, seed=1).rows
    c = load_pairs("stsb", sample=50, seed=2).rows
    assert a.pair_id.tolist() == b.pair_id.tolist() != c.pair_id.tolist()
    assert a.row.is_monotonic_increasing  # kept in source order
    assert load_pairs("stsb", sample=50, seed=1, limit=5).rows.pair_id.tolist() == a.pair_id.tolist()[:5]


BAD_ROWS = [
    # id, text_a, text_b, score, expected reason
    ("g1", "A man is playing a guitar.", "A man plays the guitar.", "4.0", None),
    ("g2", "A dog runs in the park.", "A cat sleeps on a sofa.", "0.5", None),
    ("e1", "", "Something.", "1.0", "empty_text_a"),
    ("e2", "Something.", "   ", "1.0", "empty_text_b"),
    ("", "No id here.", "None at all.", "1.0", "missing_pair_id"),
    ("g1", "Same id again.", "Twice.", "1.0", "duplicate_pair_id"),
    ("u1", "Caf\udce9 au lait.", "Coffee.", "2.0", "undecodable_text_a"),  # a latin-1 byte in the file
    ("u2", "Fine.", "Bad \ufffd char.", "2.0", "undecodable_text_b"),
    ("l1", "Good text.", "Good too.", "high", "bad_label"),
    ("l2", "Good text.", "Good too.", "7.5", "bad_label"),
    ("t1", " ".join(["word"] * 300), "Short.", "3.0", "too_long_a"),
    ("g3", "Two men are cooking.", "Two men are preparing food.", "", None),  # no label: allowed
]


def write_bad_file(path: Path) -> Path:
    lines = ["id\tsentence1\tsentence2\tscore"] + ["\t".join(r[:4]) for r in BAD_ROWS]
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", errors="surrogateescape"))
    return path


def test_validation_gives_every_bad_row_its_reason(tmp_path, minilm):
    pairs = load_pairs(str(write_bad_file(tmp_path / "bad.tsv")), label_range=(0.0, 5.0))
    tok = minilm[0].tokenizer
    def count(texts):  # tokens per text (and as content tokens: no row here lacks content)
        n = [len(x) for x in tok(texts, truncation=False)["input_ids"]]
        return n, n

    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range, count=count, max_tokens=256,
                                quarantine_long=True)  # fmt: skip
    expected = {k: r[4] for k, r in enumerate(BAD_ROWS) if r[4]}
    assert dict(zip(quarantine.row, quarantine.reason)) == expected
    assert good.pair_id.tolist() == ["g1", "g2", "g3"]
    assert len(good) + len(quarantine) == len(BAD_ROWS)
    # Quarantined text is stored Parquet-safe: the undecodable byte as an escape.
    assert quarantine.set_index("reason").loc["undecodable_text_a", "text_a"] == "Caf\\udce9 au lait."
    pa.table({"t": quarantine.text_a.tolist()})  # valid UTF-8 throughout


def test_the_manifests_commands_give_the_same_run_id(tmp_path):
    """The report's "equivalent command" of an invocation: the one the manifest records (its settings, not its --out)
    and, for a store made before commands were recorded, the one made from its config, each run again: the same run
    folder, nothing computed. With the settings that leave the run id's defaults: adaptive N by doubling (the CLI's
    default is panels), same-token cells, a prompt."""
    import shlex

    from jobs.analyses.facts import attribute_command
    from jobs.attribute import main, parse_args

    data = write_tsv(tmp_path / "pairs.tsv", stsb_rows(3))
    flags = ["--dataset", str(data), "--layer", "-1", "--steps", "2", "--tolerance", "0.5", "--refine", "double",
             "--cells", "same-token", "--prompt", "query: ", "--executor", "local", "--quiet"]  # fmt: skip
    first = main(parse_args([*flags, "--out", str(tmp_path / "runs")]))
    manifest = json.loads((Path(first["run_dir"]) / "manifest.json").read_text(encoding="utf-8"))
    recorded = manifest["runs"][0]["command"]
    made = attribute_command(manifest["config"], manifest["runs"][0]["selection"])
    assert "--out" not in recorded and "--refine double" in made and "--cells same-token" in made
    for command in (recorded, made):
        argv = shlex.split(command)[3:]  # python -m jobs.attribute
        again = main(parse_args([*argv, "--executor", "local", "--out", str(tmp_path / "runs"), "--quiet"]))
        assert again["run_dir"] == first["run_dir"] and again["computed_pairs"] == 0, command


@pytest.mark.parametrize("name", ["p.parquet", "p.jsonl"])
def test_a_text_that_is_a_list_or_a_mapping_is_a_malformed_row(tmp_path, name):
    """A Parquet list column or a JSON array / object where a text goes: quarantined, not attributed as "['a']"."""
    path = tmp_path / name
    if name.endswith(".parquet"):  # a column of lists beside a column of texts
        pd.DataFrame({"id": ["1", "2"], "sentence1": [["A cat."], ["A dog."]], "sentence2": ["B.", "C."]}).to_parquet(path)
    else:
        rows = [{"id": "1", "sentence1": ["A cat."], "sentence2": "B."}, {"id": "2", "sentence1": "A dog.",
                "sentence2": {"text": "C."}}, {"id": "3", "sentence1": "A bird.", "sentence2": "D."}]  # fmt: skip
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pairs = load_pairs(str(path))
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert good.pair_id.tolist() == ([] if name.endswith(".parquet") else ["3"])
    assert quarantine.reason.tolist() == ["malformed_row"] * 2 and quarantine.pair_id.tolist() == ["1", "2"]
    details = quarantine.detail.tolist()
    assert details[0].startswith("text_a is a ") and details[0].endswith(", not text"), details
    assert details[1] == ("text_a is a list, not text" if name.endswith(".parquet") else "text_b is a dict, not text")


def test_malformed_jsonl_line_is_quarantined(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "1", "sentence1": "A.", "sentence2": "B."}\nnot json\n[1, 2]\n', encoding="utf-8")
    pairs = load_pairs(str(path))
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert good.pair_id.tolist() == ["1"]
    assert quarantine.reason.tolist() == ["malformed_row", "malformed_row"]


@pytest.mark.parametrize(("name", "text"), [
    ("p.tsv", "sentence1\tsentence2\nA cat\tsits on a mat.\tA dog sits on a rug.\nA.\tB.\nOnly one field\n\n"),
    ("p.csv", 'sentence1,sentence2,score\n"Unclosed quote,"x",2\nA.,B.,4\n'),
])
def test_a_delimited_row_of_more_or_fewer_fields_than_the_header_is_quarantined(tmp_path, name, text):
    """Which field is which is not known in a row of the wrong length (a tab inside a TSV text, a stray quote in a
    CSV): it is quarantined as malformed_row with the counts, never read as texts shifted by a column. An empty line
    has no fields: its texts are empty."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    pairs = load_pairs(str(path), label="score" if name.endswith(".csv") else "none")
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert good.text_a.tolist() == ["A."] and good.text_b.tolist() == ["B."]
    wrong = quarantine[quarantine.reason == "malformed_row"]
    if name.endswith(".tsv"):
        assert wrong.row.tolist() == [0, 2] and quarantine.reason.tolist()[-1] == "empty_text_a"
        assert wrong.detail.tolist() == ["3 field(s) where the header has 2", "1 field(s) where the header has 2"]
    else:
        assert wrong.row.tolist() == [0] and wrong.detail.tolist() == ["2 field(s) where the header has 3"]
    assert len(good) + len(quarantine) == text.count("\n") - 1  # every line but the header, one row each


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_float_nan_and_inf_labels_are_bad_labels_null_is_no_label(tmp_path, fmt):
    # JSON's NaN/Infinity literals and Parquet's float NaN are labels that are not finite numbers; null is "none".
    labels = [1.0, float("nan"), float("inf"), None]
    rows = [{"id": str(k), "sentence1": f"A{k}.", "sentence2": f"B{k}.", "score": x} for k, x in enumerate(labels)]
    path = tmp_path / f"p.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")  # NaN, Infinity, null
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    pairs = load_pairs(str(path))
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range)
    assert good.pair_id.tolist() == ["0", "3"] and np.isnan(good.label.iat[1])  # 3: no label, computed
    assert quarantine.pair_id.tolist() == ["1", "2"] and set(quarantine.reason) == {"bad_label"}
    assert quarantine.label.tolist() == ["nan", "inf"] and all("not finite" in d for d in quarantine.detail)


# --------------------------------------------------------------------------- store (no Ray)
def test_run_id_hashes_what_changes_the_numbers():
    from jobs.attribute import parse_args, settings
    from jobs.attribution.prepare import run_config
    from jobs.config import JobSettings

    class FakeExplainer:
        settings = {"model": "m", "layer": 3, "n_layers": 6, "mode": "approx", "similarity": "cos",
                    "rule": "gauss-legendre", "steps": 16, "tolerance": None, "max_steps": None}  # fmt: skip

    base_args = parse_args(["--dataset", "stsb"])
    pairs = load_pairs("stsb", split="test", limit=3)
    base = run_config(JobSettings.from_args(base_args).attribution, FakeExplainer(), "w" * 64, pairs)
    rid = jstore.run_id(base)
    assert rid == jstore.run_id(json.loads(json.dumps(base))) and len(rid) == 16
    # --limit / --sample select rows: same run
    limit9 = settings(["--dataset", "stsb", "--limit", "9"]).attribution
    assert jstore.run_id(run_config(limit9, FakeExplainer(), "w" * 64,
                                    load_pairs("stsb", split="test", sample=7))) == rid  # fmt: skip
    for change in (dict(weights_sha256="x" * 64), dict(steps=8), dict(layer=2), dict(mode="exact"),
                   dict(rule="riemann"), dict(similarity="dot"), dict(min_abs=0.01), dict(code_version="9"),
                   dict(dataset={**base["dataset"], "split": "dev"})):  # fmt: skip
        assert jstore.run_id({**base, **change}) != rid, change


CUT_COMMIT = """
import os, signal, sys
import pyarrow as pa
from jobs import store as jstore

def t(table):  # one row of the table's schema
    return pa.Table.from_pylist([{"pair_id": "a", "sentence_id": "s"}], schema=jstore.SCHEMAS[table])

def kill_at_the_pairs_rename(event, args):  # os.replace's audit event: SIGKILL as the pairs part is moved in
    if event == "os.rename" and os.path.basename(os.path.dirname(args[1])) == "pairs":
        os.kill(os.getpid(), signal.SIGKILL)

store = jstore.RunStore(sys.argv[1], "r").open()
store.commit(0, {"pairs": t("pairs"), "cells": t("cells"), "sentences": t("sentences")})
sys.addaudithook(kill_at_the_pairs_rename)
store.commit(1, {"pairs": t("pairs"), "cells": t("cells"), "word_cells": t("word_cells")})
"""


def test_commit_is_atomic_and_recovery_removes_a_cut_commit(tmp_path):
    """A writer process SIGKILLed between the renames of its second commit (as it moves the pairs part in, the
    interpreter's audit hook kills it): the parts already moved stay on disk, and the next writer removes them."""
    proc = subprocess.run([sys.executable, "-c", CUT_COMMIT, str(tmp_path)], cwd=ROOT, capture_output=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    for table in ("cells", "word_cells"):  # moved in before the kill: orphans a reader may glance at
        assert (tmp_path / "r" / table / "part-000001.parquet").exists()
    assert not (tmp_path / "r" / "pairs" / "part-000001.parquet").exists()
    assert (tmp_path / "r" / "_staging").exists()
    store = jstore.RunStore(tmp_path, "r").open()  # the next run cleans up
    assert [p.name for p in store.parts("cells")] == ["part-000000.parquet"]
    assert store.parts("word_cells") == [] and not (tmp_path / "r" / "_staging").exists()
    assert store.next_seq() == 1 and store.done_pair_ids() == {"a"}
    with pytest.raises(RuntimeError, match="lock"):
        jstore.RunStore(tmp_path, "r").open()  # one writer at a time
    store.close()


def test_sentences_parts_are_written_in_small_row_groups(tmp_path):
    """A wave's `sentences` part (large rows: two D-float vectors each) in row groups of 4,096 rows, which bounds
    the writer's memory, its vectors BYTE_STREAM_SPLIT without a dictionary, its strings with one; other tables in
    one group up to 1M rows; the same rows give the same bytes, whether the driver commits the part or a stage-2
    task writes it through a PartSink; DuckDB reads the vectors back exactly."""
    import duckdb
    import pyarrow.parquet as pq
    from jobtools import commit_large_rows, row_groups

    for rid in ("r1", "r2"):
        store = jstore.RunStore(tmp_path, rid).open()
        tables = commit_large_rows(store)
        store.close()
    run = tmp_path / "r1"
    for name in ("part-000000.parquet", "part-000001-0000000.parquet"):
        assert row_groups(run / "sentences" / name) == [4096, 4096, 1808]
        assert row_groups(run / "cells" / name) == [10_000]
    assert row_groups(run / "pairs" / "part-000000.parquet") == [10_000]
    part = run / "sentences" / "part-000000.parquet"
    assert pq.read_table(part).equals(tables["sentences"])
    group = pq.ParquetFile(part).metadata.row_group(0)
    encodings = {group.column(c).path_in_schema: set(group.column(c).encodings) for c in range(group.num_columns)}
    for vector in ("embedding", "reference_embedding"):
        assert encodings[f"{vector}.list.element"] == {"BYTE_STREAM_SPLIT", "RLE"}
    assert "RLE_DICTIONARY" in encodings["tokens.list.element"] and "RLE_DICTIONARY" in encodings["sentence_id"]
    want = np.asarray(tables["sentences"]["embedding"].to_pylist(), dtype=np.float32)
    got = duckdb.sql(f"select embedding from '{part}' order by sentence_id").fetchnumpy()["embedding"]
    assert np.array_equal(np.stack(got).astype(np.float32), want)
    for table in ("sentences", "pairs", "cells"):
        assert (run / table / "part-000000.parquet").read_bytes() == \
            (tmp_path / "r2" / table / "part-000000.parquet").read_bytes()  # fmt: skip


def test_parts_written_by_workers_commit_with_their_wave_and_strays_go(tmp_path):
    """Stage-2 tasks write cells parts (part-<wave>-<first ord>) through a PartSink; the wave is committed by its
    pairs part; a part no task reported (an attempt a retry replaced) is deleted before the commit, a reported
    part that is missing fails the commit, and parts of a wave that never committed are removed on open."""
    import pickle

    store = jstore.RunStore(tmp_path, "r").open()
    sink = pickle.loads(pickle.dumps(store.sink()))  # it travels to the Ray workers

    def t(table: str, pair: str = "a") -> pa.Table:
        return pa.Table.from_pylist([{"pair_id": pair, "sentence_id": "s"}], schema=jstore.SCHEMAS[table])

    kept = {sink.write("cells", 0, 0, t("cells")), sink.write("cells", 0, 256, t("cells", "b"))}
    assert kept == {"part-000000-0000000.parquet", "part-000000-0000256.parquet"}
    stray = sink.write("cells", 0, 128, t("cells", "b"))
    with pytest.raises(jstore.StoreError, match="1 cells part.* of wave 0 reported written but not in the store"):
        store.settle(0, {"cells": kept | {"part-000000-0000512.parquet"}})
    store.settle(0, {"cells": kept})
    store.commit(0, {"pairs": pa.concat_tables([t("pairs"), t("pairs", "b")])})
    assert {p.name for p in store.parts("cells")} == kept and stray not in kept
    assert store.next_seq() == 1

    sink.write("cells", 1, 0, t("cells", "c"))  # wave 1: its cells land, the driver dies before its pairs part
    (tmp_path / "r" / "word_cells" / ".part-000001-0000000.parquet.99.tmp").write_bytes(b"cut short")
    store.close()
    store = jstore.RunStore(tmp_path, "r").open()
    assert {p.name for p in store.parts("cells")} == kept
    assert not list((tmp_path / "r" / "word_cells").iterdir())
    assert store.next_seq() == 1 and store.done_pair_ids() == {"a", "b"}
    store.close()


# --------------------------------------------------------------------------- stage 2 == Explainer.pair (no Ray)
@pytest.fixture(scope="module")
def small_factors(minilm):
    from jobs.attribution.actors import FactorActor
    from xsbert_core import Explainer

    texts = ["A man is playing a guitar.", "Someone plays an instrument on stage.", "The cat sat."]
    actor = FactorActor(EngineSettings(minilm_model_name(), layer=-1, mode="approx", similarity="cos", steps=2))
    table = actor(pa.table({"sentence_id": ["s0", "s1", "s2"], "text": texts}))
    ex = Explainer(minilm, layer=-1, steps=2)
    return texts, table, ex


def minilm_model_name() -> str:
    from xsbert_core import DEFAULT_MODEL

    return DEFAULT_MODEL


def test_stage2_equals_the_independent_computation(tiny, tmp_path):
    """FactorActor -> PairCells (stage 1 + 2 of the job, without Ray) against tests/independent.py: every
    cell, word cell and pair number, on a tiny BERT saved as a sentence-transformers folder."""
    import independent as ind

    from jobs.attribution.actors import FactorActor, PairCells

    folder = tmp_path / "tiny-bert"
    model = tiny.get("bert", n_layers=3)
    model.save(str(folder))
    texts = ["A man is playing a guitar.", "Someone plays an unbelievably loud instrument on stage.", "The cat sat."]
    actor = FactorActor(EngineSettings(str(folder), layer=1, mode="approx", similarity="cos", steps=3))
    table = actor(pa.table({"sentence_id": ["s0", "s1", "s2"], "text": texts}))
    assert table.column("failure").null_count == table.num_rows
    out = PairCells([table], "cos")(pa.table({"ord": [0, 1], "pair_id": ["p0", "p1"], "sentence_id_a": ["s0", "s2"],
                                              "sentence_id_b": ["s1", "s1"]}))  # fmt: skip
    refs = [ind.sentence(model, t, 1, "approx", "gauss-legendre", 3) for t in texts]
    tok = model[0].tokenizer

    def words(text: str) -> tuple[list[str], np.ndarray]:
        """Words by the tokenizer's word ids, and the (U, S) token-averaging matrix: specials in no word."""
        enc = tok(text, return_offsets_mapping=True)
        wids, offs = enc.word_ids(), enc["offset_mapping"]
        order = sorted({w for w in wids if w is not None})
        m = np.zeros((len(order), len(wids)))
        for u, w in enumerate(order):
            m[u, [i for i, x in enumerate(wids) if x == w]] = 1.0
        spans = [[offs[i] for i, x in enumerate(wids) if x == w] for w in order]
        return [text[s[0][0] : s[-1][1]] for s in spans], m / m.sum(1, keepdims=True)

    for k, (a, b) in enumerate([(0, 1), (2, 1)]):
        row = {name: out.column(name)[k].as_py() for name in out.column_names}
        want = ind.pair(refs[a], refs[b], "cos")
        m = np.full(want["matrix"].shape, np.nan)
        m[row["cell_i"], row["cell_j"]] = row["cell_value"]
        np.testing.assert_allclose(m, want["matrix"], rtol=1e-5, atol=1e-5 * np.abs(want["matrix"]).max())
        tokens_a, tokens_b = tok.convert_ids_to_tokens(refs[a].ids), tok.convert_ids_to_tokens(refs[b].ids)
        assert row["cell_token_a"] == [tokens_a[i] for i in row["cell_i"]]
        assert row["cell_token_b"] == [tokens_b[j] for j in row["cell_j"]]
        for name in ("score", "ref_sim_a", "ref_sim_b", "ref_term", "target"):
            assert row[name] == pytest.approx(want[name], abs=1e-6), name
        assert row["attribution_sum"] == pytest.approx(float(want["matrix"].sum()), abs=1e-6)
        assert row["positive_sum"] == pytest.approx(float(want["matrix"][want["matrix"] > 0].sum()), abs=1e-6)
        assert row["completeness_error"] == pytest.approx(want["error"], abs=1e-6)
        (wa, ma), (wb, mb) = words(texts[a]), words(texts[b])
        w = np.full((len(wa), len(wb)), np.nan)
        w[row["word_u"], row["word_v"]] = row["word_value"]
        np.testing.assert_allclose(w, ma @ want["matrix"] @ mb.T, rtol=1e-5, atol=1e-7)
        assert row["word_a"][:: len(wb)] == wa and row["word_b"][: len(wb)] == wb
        check_ranks_and_top_cells(row, m, w, tok(texts[a]).word_ids(), tok(texts[b]).word_ids())


def check_ranks_and_top_cells(row: dict, m: np.ndarray, w: np.ndarray, wids_a: list, wids_b: list) -> None:
    """The ranks and top-10 lists stage 2 stores for agreement.sql, against scipy's rankdata and sorted() on the
    pair's matrices as stored (m: token cells, w: word cells): average ranks (ties share their mean) over all cells
    and over the cells of two content tokens (null in a special token's row or column), top-10 by |value| and by
    value, largest first, ties by the smaller row then column."""
    from scipy.stats import rankdata

    assert row["cell_value_rank"] == rankdata(m.ravel()).astype(np.float32).tolist()  # cells are row-major
    content = np.outer([x is not None for x in wids_a], [x is not None for x in wids_b])
    want = np.full(m.shape, np.nan)
    want[content] = rankdata(m[content])
    assert row["cell_content_rank"] == [None if np.isnan(r) else float(np.float32(r)) for r in want.ravel()]
    assert row["word_value_rank"] == rankdata(w.ravel()).astype(np.float32).tolist()

    def top(mat: np.ndarray, by: str, names: tuple[str, str], mask: np.ndarray | None = None) -> list[dict]:
        cells = [(r, c) for r in range(mat.shape[0]) for c in range(mat.shape[1]) if mask is None or mask[r, c]]
        key = (lambda rc: (-abs(mat[rc]), rc)) if by == "abs" else (lambda rc: (-mat[rc], rc))
        return [dict(zip(names, map(int, rc))) for rc in sorted(cells, key=key)[:10]]

    for by in ("abs", "value"):
        assert row[f"top10_{by}"] == top(m, by, ("i", "j"))
        assert row[f"content_top10_{by}"] == top(m, by, ("i", "j"), content)
        assert row[f"word_top10_{by}"] == top(w, by, ("u", "v"))
    assert row["top10_abs"] != row["top10_value"] or (m >= 0).all()  # the two orders differ on these matrices


def test_min_abs_prunes_cells_never_sums(small_factors):
    from jobs.attribution.actors import PairCells

    _, table, _ = small_factors
    batch = pa.table({"ord": [0], "pair_id": ["p"], "sentence_id_a": ["s0"], "sentence_id_b": ["s1"]})
    full = PairCells([table], "cos")(batch)
    values = np.abs(np.asarray(full.column("cell_value")[0].as_py()))
    threshold = float(np.quantile(values, 0.75))
    pruned = PairCells([table], "cos", min_abs=threshold)(batch)
    kept = np.asarray(pruned.column("cell_value")[0].as_py())
    assert 0 < len(kept) < len(values) and (np.abs(kept) >= threshold).all()
    for name in ("attribution_sum", "positive_sum", "negative_sum", "score", "completeness_error"):
        assert pruned.column(name)[0].as_py() == full.column(name)[0].as_py()
    # ranks are over the whole matrix (min_abs only leaves cells out), the top-10 lists too
    full_ranks = dict(zip(zip(full.column("cell_i")[0].as_py(), full.column("cell_j")[0].as_py()),
                          full.column("cell_value_rank")[0].as_py()))  # fmt: skip
    kept_cells = zip(pruned.column("cell_i")[0].as_py(), pruned.column("cell_j")[0].as_py())
    assert pruned.column("cell_value_rank")[0].as_py() == [full_ranks[c] for c in kept_cells]
    for name in ("top10_abs", "content_top10_abs", "word_top10_value"):
        assert pruned.column(name)[0].as_py() == full.column(name)[0].as_py()


def test_a_failed_sentence_fails_only_its_pairs(small_factors):
    from jobs.attribution.actors import PairCells, factor_rows

    _, table, _ = small_factors
    failed = factor_rows(["bad"], ["x"], ["NumericalError: NaN"])
    out = PairCells([table, failed], "cos")(
        pa.table({"ord": [0, 1], "pair_id": ["p0", "p1"], "sentence_id_a": ["s0", "bad"],
                  "sentence_id_b": ["s1", "s1"]})  # fmt: skip
    )
    assert out.column("failure").to_pylist() == [None, "NumericalError: NaN"]


# --------------------------------------------------------------------------- real runs
# On Ray (ray_cluster, conftest.py), or --executor local where what a test checks is the driver's (no actor to start).
def explain_json(tmp_path: Path, a: str, b: str) -> dict:
    """What `xsbert explain` writes for the pair, with the test runs' settings."""
    from jobs.cli import main as xsbert

    out = tmp_path / "explain.json"
    assert xsbert(["explain", a, b, *FAST_ENGINE, "--words", "--json", str(out), "-q"]) == 0
    return json.loads(out.read_text())


@pytest.mark.slow
def test_job_counts_cells_and_rerun(ray_cluster, tmp_path, capsys):
    out = tmp_path / "runs"
    s = run_job(out, "--dataset", "stsb", "--split", "test", "--limit", "12")
    run_dir = Path(s["run_dir"])
    printed = capsys.readouterr().out
    assert f"store: {run_dir}" in printed.splitlines() and f"xsbert sql --run {run_dir}" in printed
    assert (s["n_in"], s["n_done"], s["n_quarantined"], s["computed_pairs"]) == (12, 12, 0, 12)

    # Pair counts exact, each pair once, and its cells sum to its (unpruned) attribution_sum.
    assert q(run_dir, "select count(*), count(distinct pair_id) from {pairs}") == [(12, 12)]
    expected_ids = load_pairs("stsb", split="test", limit=12).rows.pair_id.tolist()
    assert [r[0] for r in q(run_dir, "select pair_id from {pairs} order by row")] == expected_ids
    worst = q(run_dir, """
        select max(abs(p.attribution_sum - c.total)), bool_and(p.n_cells = c.n) from {pairs} p
        join (select pair_id, sum(value) as total, count(*) as n from {cells} group by pair_id) c using (pair_id)
    """)  # fmt: skip
    assert worst[0][0] < 1e-9 and worst[0][1]
    assert q(run_dir, "select count(*) from {cells} c anti join {pairs} p using (pair_id)") == [(0,)]
    assert q(run_dir, "select count(*) from {quarantine}") == [(0,)]  # empty, but there to query
    # Unique sentences once each; every pair's sentences are there.
    n_unique = len(set(load_pairs("stsb", split="test", limit=12).rows[["text_a", "text_b"]].values.ravel()))
    assert q(run_dir, "select count(*), count(distinct sentence_id) from {sentences}") == [(n_unique, n_unique)]
    assert s["computed_sentences"] == n_unique
    assert q(run_dir, """select count(*) from {pairs} p left join {sentences} s on s.sentence_id = p.sentence_id_a
                         where s.sentence_id is null""") == [(0,)]  # fmt: skip

    # The cells of a pair equal `xsbert explain` for that pair.
    for pid, a, b in q(run_dir, "select pair_id, text_a, text_b from {pairs} order by row limit 2"):
        ref = explain_json(tmp_path, a, b)
        rows = q(run_dir, f"select i, j, token_a, token_b, value from {{cells}} where pair_id = '{pid}'")
        matrix = np.full(np.shape(ref["matrix"]), np.nan)
        for i, j, ta, tb, v in rows:
            matrix[i, j] = v
            assert (ta, tb) == (ref["tokens_a"][i], ref["tokens_b"][j])
        np.testing.assert_allclose(matrix, ref["matrix"], rtol=1e-4, atol=1e-6)
        ((score, total, err),) = q(run_dir, f"select score, attribution_sum, completeness_error from {{pairs}} "
                                            f"where pair_id = '{pid}'")  # fmt: skip
        assert score == pytest.approx(ref["score"], abs=1e-6)
        assert total == pytest.approx(ref["attribution_sum"], abs=1e-5)
        assert err == pytest.approx(ref["error"], abs=1e-5)
        words = np.full(np.shape(ref["word_matrix"]), np.nan)
        for u, v, value in q(run_dir, f"select u, v, value from {{word_cells}} where pair_id = '{pid}'"):
            words[u, v] = value
        np.testing.assert_allclose(words, ref["word_matrix"], rtol=1e-4, atol=1e-6)

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["run_id"] == run_dir.name == s["run_id"]
    assert manifest["tables"]["pairs"]["rows"] == 12 and manifest["config"]["layer"] == 5
    assert set(manifest["tables"]) == set(TABLES)

    # Rerun with the same config: nothing computed, every file byte-identical.
    before = file_hashes(run_dir)
    again = run_job(out, "--dataset", "stsb", "--split", "test", "--limit", "12")
    assert again["run_id"] == s["run_id"]
    assert (again["computed_pairs"], again["computed_sentences"], again["wrote_files"]) == (0, 0, 0)
    assert (again["n_in"], again["n_done"]) == (12, 12)
    assert file_hashes(run_dir) == before


@pytest.mark.slow
def test_job_grown_dataset_computes_only_new_pairs(tmp_path):
    """Which pairs a run computes is the driver's to decide, before any executor (--executor local: no actor to
    start; a grown run on Ray: tests/test_store_backends.py)."""
    data, out = tmp_path / "pairs.tsv", tmp_path / "runs"
    first = run_job(out, "--dataset", str(write_tsv(data, stsb_rows(8))), "--executor", "local")
    run_dir = Path(first["run_dir"])
    assert first["computed_pairs"] == 8
    old = {r[0]: r[1:] for r in q(run_dir, "select pair_id, score, attribution_sum from {pairs}")}
    before = file_hashes(run_dir)

    write_tsv(data, pd.concat([stsb_rows(8), stsb_rows(5, start=8)]))  # the dataset grew by 5 pairs
    second = run_job(out, "--dataset", str(data), "--executor", "local")
    assert second["run_id"] == first["run_id"] and second["computed_pairs"] == 5
    assert (second["n_in"], second["n_done"], second["n_quarantined"]) == (13, 13, 0)
    assert q(run_dir, "select count(*), count(distinct pair_id) from {pairs}") == [(13, 13)]
    assert q(run_dir, "select count(distinct pair_id) from {cells}") == [(13,)]
    assert q(run_dir, "select count(*) = count(distinct sentence_id) from {sentences}") == [(True,)]
    # Earlier parts untouched, earlier numbers unchanged.
    after = file_hashes(run_dir)
    assert all(after[name] == digest for name, digest in before.items() if name != "manifest.json")
    now = {r[0]: r[1:] for r in q(run_dir, "select pair_id, score, attribution_sum from {pairs}")}
    assert {k: v for k, v in now.items() if k in old} == old
    assert len(json.loads((run_dir / "manifest.json").read_text())["runs"]) == 2


@pytest.mark.slow
def test_job_quarantines_bad_rows_and_attributes_the_rest(tmp_path):
    """The driver quarantines before any executor (--executor local: no actor to start)."""
    out = tmp_path / "runs"
    data = write_bad_file(tmp_path / "bad.tsv")
    s = run_job(out, "--dataset", str(data), "--label-range", "0:5", "--executor", "local")
    run_dir = Path(s["run_dir"])
    n_bad = sum(1 for r in BAD_ROWS if r[4])
    assert (s["n_in"], s["n_done"], s["n_quarantined"]) == (len(BAD_ROWS), len(BAD_ROWS) - n_bad, n_bad)
    got = sorted(q(run_dir, "select row, reason from {quarantine}"))
    assert got == sorted((k, r[4]) for k, r in enumerate(BAD_ROWS) if r[4])
    assert sorted(r[0] for r in q(run_dir, "select pair_id from {pairs}")) == ["g1", "g2", "g3"]
    assert q(run_dir, "select label is null from {pairs} where pair_id = 'g3'") == [(True,)]
    assert all(d for (d,) in q(run_dir, "select detail from {quarantine}"))
    # A rerun adds no quarantine rows (deduplicated by row, pair id and reason).
    again = run_job(out, "--dataset", str(data), "--label-range", "0:5", "--executor", "local")
    assert again["wrote_files"] == 0 and again["n_quarantined"] == n_bad
    assert q(run_dir, "select count(*) from {quarantine}") == [(n_bad,)]


def test_all_rows_quarantined_still_gives_queryable_tables(tmp_path):
    # No pair to compute: no Ray at all, and every table is a (possibly empty) Parquet table.
    data = tmp_path / "bad.tsv"
    data.write_text("id\tsentence1\tsentence2\tscore\nx\t\tB.\t1\ny\tA.\t \t2\n", encoding="utf-8")
    s = run_job(tmp_path / "runs", "--dataset", str(data))
    run_dir = Path(s["run_dir"])
    assert (s["n_in"], s["n_done"], s["n_quarantined"], s["computed_pairs"]) == (2, 0, 2, 0)
    assert q(run_dir, "select reason from {quarantine} order by row") == [("empty_text_a",), ("empty_text_b",)]
    for table in ("pairs", "cells", "word_cells", "sentences"):
        assert q(run_dir, f"select count(*) from {{{table}}}") == [(0,)], table
    assert q(run_dir, "select count(*) from {pairs} p join {cells} c using (pair_id)") == [(0,)]
    for table, schema in jstore.SCHEMAS.items():
        assert all(pq.read_schema(p) == schema for p in (run_dir / table).glob("*.parquet")), table


def test_no_arguments_means_the_embedded_default():
    from jobs.attribute import parse_args
    from jobs.config import DEFAULT_SAMPLE

    args = parse_args([])
    assert (args.dataset, args.split, args.sample, args.seed, args.out) == ("stsb", "test", DEFAULT_SAMPLE, 0, "runs")
    flags = parse_args(["--dataset", "stsb", "--split", "test", "--limit", "20", "--steps", "4", "--out", "D"])
    assert (flags.limit, flags.sample, flags.steps, flags.out) == (20, None, 4, "D")


def test_bad_arguments_exit_2_with_a_clear_message(tmp_path, capsys):
    from jobs.attribute import cli

    assert cli(["--dataset", str(tmp_path / "missing.tsv"), "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    no_text = write_tsv(tmp_path / "x.tsv", pd.DataFrame({"foo": ["a"], "bar": ["b"]}))
    assert cli(["--dataset", str(no_text), "--out", str(tmp_path)]) == 2
    assert "--text-a-column" in capsys.readouterr().err
    assert cli(["--dataset", "stsb", "--limit", "2", "--steps", "0", "--out", str(tmp_path)]) == 2
    assert "jobs.attribute: error:" in capsys.readouterr().err
    # a device torch does not know: said before anything is read (and before Ray starts)
    assert cli(["--dataset", "stsb", "--limit", "2", "--device", "gpu0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("jobs.attribute: error: device 'gpu0': not a torch device (")
    assert not list(tmp_path.glob("*/pairs"))  # nothing written


def test_cuda_for_factor_actors_on_a_cluster_without_gpus_is_one_line(ray_cluster):
    """Ray hides every GPU from an actor that gets none: --device cuda there is said before the pool starts."""
    from jobs.attribute import settings
    from jobs.attribution.stage1 import resources

    with pytest.raises(InputError, match=r"^--device cuda:0: the factor actors get no GPU \(the cluster has none\)"):
        resources(settings(["--device", "cuda:0"]).execution, ray_cluster)


def test_the_driver_holds_the_selection_compactly():
    """The driver's per-pair and per-sentence state: `good`'s strings in Arrow buffers with the same values, and the
    stored sentence ids as 64-bit keys that answer membership as a set of the strings does."""
    from jobs.attribution.prepare import compact, sentence_id
    from jobs.attribution.worklist import SentenceKeys

    strings = {"pair_id": ["a", "b"], "text_a": ["x ü", "y"], "text_b": ["z", "w"], "keep:src": ["s", None]}
    frame = pd.DataFrame({"row": [0, 1], "label": [1.0, float("nan")],  # validate's `good`: object columns
                          **{c: pd.Series(v, dtype=object) for c, v in strings.items()}})  # fmt: skip
    small = compact(frame)
    assert all(small[c].dtype == pd.ArrowDtype(pa.string()) for c in strings)
    assert small.row.dtype == np.int64 and small.label.dtype == np.float64
    assert small.text_a.tolist() == ["x ü", "y"] and small["keep:src"].isna().tolist() == [False, True]
    assert small[small.pair_id.isin({"b"})].text_b.tolist() == ["w"]
    ids = [sentence_id(f"s{k}") for k in range(50)]
    known = SentenceKeys(ids[:20])
    assert len(known) == 20 and known.contains(ids).tolist() == [True] * 20 + [False] * 30
    known.add(ids[10:30])
    assert len(known) == 30 and known.contains(ids).tolist() == [True] * 30 + [False] * 20
    assert SentenceKeys().contains(ids[:3]).tolist() == [False] * 3 and SentenceKeys().contains([]).size == 0
    # the keys are read from Arrow's string buffers (chunked, sliced, upper case), equal to int(id, 16)
    column = pa.chunked_array([pa.array(ids[:7]), pa.array([i.upper() for i in ids[7:]]).slice(3)])
    assert SentenceKeys._keys(column).tolist() == [int(i, 16) for i in ids[:7] + ids[10:]]
    assert SentenceKeys(column).contains(pa.array(ids)).tolist() == [True] * 7 + [False] * 3 + [True] * 40
    for bad in (["abc"], ["0123456789abcdeg"], [ids[0], None]):
        with pytest.raises(ValueError, match="sentence id"):
            SentenceKeys(pa.array(bad, pa.string()))
    # the pairs' sentence ids, each distinct text hashed once: sentence_id of each text
    from jobs.attribution.prepare import with_sentence_ids
    from jobs.attribution.stage2 import arrow

    pairs = compact(pd.DataFrame({"pair_id": ["p0", "p1", "p2"], "text_a": ["x", "y", "x"], "text_b": ["y", "z", "w"]},
                                 dtype=object))  # fmt: skip
    got = with_sentence_ids(pairs.iloc[[2, 0, 1]])
    assert got.sentence_id_a.tolist() == [sentence_id(t) for t in ["x", "x", "y"]]
    assert got.sentence_id_b.tolist() == [sentence_id(t) for t in ["w", "y", "z"]]
    assert got.index.tolist() == [2, 0, 1] and got.sentence_id_a.dtype == pd.ArrowDtype(pa.string())
    assert arrow(got.pair_id).to_pylist() == ["p2", "p0", "p1"]
    assert arrow(pd.Series(["a", None], dtype=object)).to_pylist() == ["a", None]


def test_prepare_keeps_none_of_the_source_rows(tmp_path):
    """What the driver keeps of the read rows once validated: nothing but the work list's file and keys. An empty
    slice of a source chunk would be a view whose base holds every value of the chunk."""
    from jobs.attribute import settings
    from jobs.attribution.prepare import prepare

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"id": f"p{k}", "sentence1": f"question {k} ?", "sentence2": f"other {k} .", "label": k % 2})
                            + "\n" for k in range(300)))  # fmt: skip
    prep = prepare(settings(["--dataset", str(data), *FAST, "--out", str(tmp_path / "runs"), "--quiet"]), chunk_rows=64)
    assert prep.work.num_rows == 300 and len(prep.work.pair_keys) == 300 and len(prep.pairs.rows) == 0
    assert prep.n_in == 300 and prep.pairs.n_source_rows == 300 and len(prep.quarantine) == 0
    for block in prep.pairs.rows._mgr.blocks:
        values = np.asarray(block.values)
        assert values.base is None or np.asarray(values.base).size == 0, "the empty rows are a view of the source"


def _eager_work_frame(args):
    """The work list as the driver built it in memory before it streamed: load_pairs, one validate, compact,
    wave_order, with_sentence_ids (the reference for the chunked prepare)."""
    from jobs.attribution.prepare import compact, with_sentence_ids
    from jobs.attribution.validate import load_pairs, validate
    from jobs.attribution.worklist import wave_order
    from jobs.config import Selection
    from xsbert_core import Explainer

    bounds = Selection(args.dataset, label_range=args.label_range).label_bounds()
    pairs = load_pairs(args.dataset, text_a=args.text_a_column, text_b=args.text_b_column, label=args.label_column,
                       ids=args.id_column, label_range=bounds, sample=args.sample,
                       seed=args.seed, limit=args.limit, keep=args.keep_columns)  # fmt: skip
    split = Explainer(args.model, layer=args.layer).split
    good, quarantine = validate(pairs.rows, pairs.label_kind, pairs.label_range, count=split.token_counts,
                                max_tokens=split.max_seq_length,
                                quarantine_long=args.truncation == "quarantine")  # fmt: skip
    frame = good.iloc[wave_order(good.text_a.to_numpy(), good.text_b.to_numpy())].reset_index(drop=True)
    return with_sentence_ids(compact(frame)), quarantine, pairs


def _chunk_test_file(path):
    """53 rows: repeated texts (components across chunks), missing labels, a pass-through column, non-ASCII, and
    bad rows: duplicate ids (in the same chunk and chunks apart), an empty text, a bad label, a malformed line."""
    rows = [{"id": f"p{k}", "sentence1": f"question {k % 11} ? é {'x' * (k % 5)}", "sentence2": f"other {k % 7} .",
             "label": (k % 2 if k % 3 else None), "source": f"s{k % 4}"} for k in range(53)]  # fmt: skip
    rows[9]["id"] = "p8"  # the row before, in the same chunk of 4 (rows 8-11)
    rows[40]["id"] = "p3"  # chunks apart
    rows[20]["sentence2"] = " "
    rows[30]["label"] = "high"
    lines = [json.dumps(r) for r in rows]
    lines[45] = "not json"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("selection", [[], ["--sample", "29", "--seed", "3"], ["--limit", "17"],
                                       ["--sample", "40", "--limit", "25"]])  # fmt: skip
def test_the_chunked_prepare_gives_the_rows_and_reasons_of_one_pass(tmp_path, selection):
    """prepare() reads, validates and spills the source 4 rows at a time: the work list's waves, the quarantine
    (duplicate ids within and across chunks, with the first row in the detail) and the counts equal one in-memory
    pass over the whole selection, for every selection (--sample, --limit, both)."""
    from jobs.attribute import parse_args
    from jobs.attribution.prepare import prepare
    from jobs.config import JobSettings

    args = parse_args(["--dataset", str(_chunk_test_file(tmp_path / "p.jsonl")), *FAST, "--keep-columns", "source",
                       "--label-range", "0:1", "--out", str(tmp_path / "runs"), "--quiet", *selection])  # fmt: skip
    frame, quarantine, pairs = _eager_work_frame(args)
    prep = prepare(JobSettings.from_args(args), chunk_rows=4)
    assert prep.n_in == len(pairs.rows) == prep.work.num_rows + len(prep.quarantine)
    assert prep.pairs.n_source_rows == pairs.n_source_rows == 53
    pd.testing.assert_frame_equal(prep.quarantine, quarantine)
    if not selection:
        assert set(quarantine.reason) == {"duplicate_pair_id", "empty_text_b", "bad_label", "malformed_row"}
        assert set(quarantine.detail[quarantine.reason == "duplicate_pair_id"]) == {"same id as source row 8",
                                                                                   "same id as source row 3"}  # fmt: skip
    n_waves = prep.work.plan(None, 10)
    assert n_waves == -(-len(frame) // 10)
    got = pd.concat([prep.work.wave(w) for w in range(n_waves)], ignore_index=True)
    pd.testing.assert_frame_equal(got, frame)


def test_the_work_list_gives_the_waves_of_the_in_memory_frame_and_leaves_no_file(tmp_path):
    """WorkList (the driver's work list, spilled chunk by chunk and memory-mapped) yields, wave by wave, exactly the
    rows, columns and dtypes of the frame it was given in wave_order (missing labels, pass-through columns,
    non-ASCII texts, a short last wave), only the rows plan() was told to compute, and its folder is gone as soon as
    it is mapped."""
    from jobs.attribute import parse_args
    from jobs.attribution.worklist import WorkList, wave_order

    args = parse_args(["--dataset", str(_chunk_test_file(tmp_path / "p.jsonl")), *FAST, "--keep-columns", "source",
                       "--label-range", "0:1", "--out", str(tmp_path / "runs"), "--quiet"])  # fmt: skip
    frame = _eager_work_frame(args)[0]
    assert frame.label.isna().any() and any(c.startswith("keep:") for c in frame.columns)
    spill = tmp_path / "spill"
    spill.mkdir()

    def spilled(frame: pd.DataFrame) -> WorkList:
        work = WorkList(directory=str(spill))
        for start in range(0, len(frame), 13):
            work.append(frame.iloc[start : start + 13])
            assert len(list(spill.iterdir())) == 1
        work.finish()
        assert list(spill.iterdir()) == [], "the spill folder outlives the mapping"
        return work

    work = spilled(frame)
    assert work.plan(None, 10) == 5 and work.n_waves == 5  # frame is in wave order already: plan keeps it
    assert list(spill.iterdir()) == [], "the wave-ordered file's folder outlives its mapping"
    for w in range(work.n_waves):
        pd.testing.assert_frame_equal(work.wave(w), frame.iloc[w * 10 : (w + 1) * 10].reset_index(drop=True))
    with pytest.raises(IndexError):
        work.wave(5)
    with pytest.raises(RuntimeError):
        work.plan(None, 10)
    source_order = frame.sort_values("row").reset_index(drop=True)  # as prepare() spills it
    work = spilled(source_order)
    todo = np.arange(len(frame)) % 3 != 1
    assert work.plan(todo, 4) == -(-int(todo.sum()) // 4)
    part = source_order[todo].reset_index(drop=True)
    expected = part.iloc[wave_order(part.text_a.to_numpy(), part.text_b.to_numpy())].reset_index(drop=True)
    got = pd.concat([work.wave(w) for w in range(work.n_waves)], ignore_index=True)
    pd.testing.assert_frame_equal(got, expected)
    assert wave_order(part.text_a.to_numpy(), part.text_b.to_numpy()).tolist() != list(range(len(part))), \
        "the selection is in wave order already: the test would not see plan() reorder"
    empty = WorkList(directory=str(spill)).finish()
    assert empty.plan(None, 10) == 0 and list(spill.iterdir()) == []


def test_the_sentences_vectors_are_read_from_the_actors_bytes_without_copies():
    """float_lists turns the actors' float32 bytes into list<float32> through the Arrow buffers (chunked, sliced,
    empty and zero-length vectors included) with the values numpy reads from each row's bytes, and vector_norms
    equals a per-row float64 norm."""
    from jobs.attribution.stage2 import float_lists, vector_norms

    rng = np.random.default_rng(0)
    vecs = [rng.standard_normal(k).astype(np.float32) for k in (384, 0, 384, 3, 0, 7)]
    raw = [v.tobytes() for v in vecs]
    chunked = pa.chunked_array([pa.array(raw[:2], pa.binary()), pa.array(raw[2:], pa.binary())])
    same = [rng.standard_normal(384).astype(np.float32) * 10.0**k for k in range(-3, 4)]  # one size: the job's case
    cases = ((chunked, vecs), (chunked.combine_chunks().slice(2, 3), vecs[2:5]),
             (pa.array(raw, pa.large_binary()), vecs), (pa.chunked_array([], pa.binary()), []),
             (pa.array([v.tobytes() for v in same], pa.binary()).slice(1), same[1:]))  # fmt: skip
    for column, expect in cases:
        lists = float_lists(column)
        assert lists.type == pa.list_(pa.float32()) and len(lists) == len(expect)
        for got, want in zip(lists.to_pylist(), expect):  # slow reference: numpy over each row's own bytes
            assert np.array_equal(np.array(got, np.float32), np.frombuffer(want.tobytes(), np.float32))
        norms = vector_norms(lists)
        assert np.allclose(norms, [np.linalg.norm(v.astype(np.float64)) for v in expect], rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="multiple of 4"):
        float_lists(pa.array([b"abc"], pa.binary()))
    with pytest.raises(ValueError, match="missing"):
        float_lists(pa.array([raw[0], None], pa.binary()))


def test_waves_group_pairs_that_share_sentences():
    """Pairs that share a sentence (directly or through other pairs) are contiguous in the wave order, in input
    order within their group; groups come in the order of their first pair. Cut into waves, no sentence is needed
    by two waves unless its group is larger than a wave."""
    from jobs.attribution.worklist import wave_order

    a = np.array(["x", "p", "y", "q", "x", "r", "z"], dtype=object)
    b = np.array(["y", "q", "w", "s", "v", "t", "w"], dtype=object)
    # groups: {x, y, w, v, z} = pairs 0, 2, 4, 6;  {p, q, s} = pairs 1, 3;  {r, t} = pair 5
    assert wave_order(a, b).tolist() == [0, 2, 4, 6, 1, 3, 5]
    assert wave_order(a[:0], b[:0]).tolist() == []
    rng = np.random.default_rng(0)
    texts = np.array([f"q{k}" for k in range(300)], dtype=object)
    a, b = texts[rng.integers(0, 300, 200)], texts[rng.integers(0, 300, 200)]
    order = wave_order(a, b)
    assert sorted(order.tolist()) == list(range(200))

    def integrated(order: np.ndarray, wave: int) -> int:
        return sum(len(set(a[order[k : k + wave]]) | set(b[order[k : k + wave]])) for k in range(0, 200, wave))

    parent: dict[str, str] = {}  # union-find over the sentences: the groups, independently of scipy

    def root(t: str) -> str:
        while parent.setdefault(t, t) != t:
            t = parent[t]
        return t

    for x, y in zip(a, b):
        parent[root(x)] = root(y)
    groups = [root(x) for x in a[order]]
    runs = [g for k, g in enumerate(groups) if k == 0 or groups[k - 1] != g]
    assert len(runs) == len(set(groups))  # each group's pairs are contiguous
    for g in set(groups):
        members = [int(k) for k, x in zip(order, groups) if x == g]
        assert members == sorted(members)  # input order within a group
    assert integrated(order, 50) < integrated(np.arange(200), 50)  # fewer sentences integrated twice


def test_the_console_drops_ray_datas_snapshot_warnings_and_keeps_the_rest():
    """The job's console filter (jobs.raycluster) drops Ray Data's resource snapshot, its issue detector's repeated
    memory warning and its own account of a failed execution (the job says what failed in one line), as Ray 2.60
    words them, and nothing else: a real error or an operator's resource warning stays."""
    import logging

    from jobs.raycluster import _DropRecords

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("ray.data", logging.WARNING, __file__, 1, message, None, None)

    dropped = [
        "\n\nOperator 'MapBatches(FactorActor)' uses 1.3GiB of memory per worker\non average (up to 2.0GiB), but Ray "
        "only requests 0.0B per worker at\nthe start of the pipeline.\n\nTo avoid out-of-memory errors, consider "
        "setting `memory=2675681280`",
        "Found 1 issues. To disable issue detection, run DataContext.get_current().issue_detectors_config.detectors = [].",
        "Warning: The Ray cluster currently does not have any available CPUs. The Dataset job will hang unless more "
        "CPUs are freed up.",
        # a failed execution, which the job says in its own line (a factor actor that could not start, ...)
        "Exception occurred in Ray Data or Ray Core internal code. If you continue to see this error, please open an "
        "issue on the Ray project GitHub page with the full stack trace below: https://github.com/ray-project/ray/",
        "Full stack trace:",
        "MapBatches(FactorActor): actors died during initialization 1 consecutive time(s) "
        "(max_consecutive_actor_init_deaths=0); failing execution.",
        "An exception was raised from a task of operator \"MapBatches(FactorActor)\". Dataset execution will now "
        "abort. To ignore this exception and continue, set DataContext.max_errored_blocks.",
        "Specifying both num_cpus and num_gpus for map tasks is experimental, and may result in scheduling or "
        "stability issues.",
    ]
    kept = [
        "Cluster resources are not enough to run any task from ActorPoolMapOperator[MapBatches(FactorActor)]. The "
        "job may hang forever unless the cluster scales up.",
        "Operator 'MapBatches(FactorActor)' failed: out of memory",
        "Found 2 errors in the dataset",
    ]
    keep = _DropRecords()
    assert [keep.filter(record(m)) for m in dropped] == [False] * len(dropped)
    assert [keep.filter(record(m)) for m in kept] == [True] * len(kept)


def test_mapped_keys_answer_as_the_arrays_in_memory_do(tmp_path):
    """mapped_keys gives back its pieces' concatenation from a file whose folder is gone at once; SentenceKeys.add
    merges chunk by chunk into the same sorted set np.union1d gives (keys before, between, after and equal to the
    stored ones), and contains() answers as np.isin does; SeenIds.first_rows finds the same keys' rows."""
    from jobs.attribution.validate import SeenIds
    from jobs.attribution.worklist import SentenceKeys, _merge_sorted, mapped_keys, sorted_contains

    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 2**63, n, dtype=np.uint64) for n in (5, 0, 17)]
    keys = mapped_keys(pieces, str(tmp_path))
    assert isinstance(keys, np.memmap) and keys.tolist() == np.concatenate(pieces).tolist()
    assert list(tmp_path.iterdir()) == []
    assert mapped_keys([], str(tmp_path)).size == 0 and mapped_keys([np.zeros(0, np.uint64)]).size == 0
    old = np.unique(rng.integers(0, 1000, 300).astype(np.uint64))
    new = np.setdiff1d(np.arange(0, 1100, 7, dtype=np.uint64), old)
    for chunk in (1, 7, 64, 10_000):
        merged = np.concatenate(list(_merge_sorted(old, new, chunk)))
        assert merged.tolist() == np.union1d(old, new).tolist()
    queries = rng.integers(0, 1100, 500).astype(np.uint64)
    assert sorted_contains(old, queries).tolist() == np.isin(queries, old).tolist()
    assert sorted_contains(np.zeros(0, np.uint64), queries).tolist() == [False] * 500
    seen = SeenIds()  # the same search, giving back each key's first row (validate's duplicate check across chunks)
    assert seen.first_rows(queries).tolist() == [-1] * 500
    seen.add(old, np.arange(len(old)) * 10)
    first = {int(k): 10 * r for r, k in enumerate(old)}
    assert seen.first_rows(queries).tolist() == [first.get(int(q), -1) for q in queries]
    ids = [f"{k:016x}" for k in rng.permutation(2000)]
    known = SentenceKeys(ids[:700], directory=str(tmp_path))
    for lo, hi in ((500, 900), (0, 10), (1500, 2000), (650, 1200)):
        known.add(ids[lo:hi])
    assert list(tmp_path.iterdir()) == []
    stored = set(ids[:1200]) | set(ids[1500:])
    assert len(known) == len(stored) and isinstance(known.keys, np.memmap)
    assert known.contains(ids).tolist() == [i in stored for i in ids]
    assert np.all(np.diff(known.keys.astype(np.int64)) > 0)


def test_a_ray_start_that_only_took_too_long_is_tried_once_more(capsys):
    """A local Ray whose raylet did not register within Ray's fixed 30 s (a machine busy starting up; seen in the
    prepared GPU run's ray-check during `make test`): shut down and started once more, saying so on stderr; another
    error, or a second slow start, is raised."""
    from jobs.raycluster import RAY_SLOW_START, once_more_if_slow

    def starts(*outcomes: Exception | None) -> tuple[list[str], object, object]:
        calls, left = [], list(outcomes)

        def init() -> None:
            calls.append("init")
            if (error := left.pop(0)) is not None:
                raise error

        return calls, init, lambda: calls.append("shutdown")

    slow = Exception(f"The current node {RAY_SLOW_START}. This could happen because ...")
    calls, init, shutdown = starts(slow, None)
    once_more_if_slow(init, shutdown)
    assert calls == ["init", "shutdown", "init"] and "trying once more" in capsys.readouterr().err
    calls, init, shutdown = starts(RuntimeError("raylet died"), None)
    with pytest.raises(RuntimeError, match="raylet died"):
        once_more_if_slow(init, shutdown)
    assert calls == ["init"]
    calls, init, shutdown = starts(slow, slow)
    with pytest.raises(Exception, match=RAY_SLOW_START):
        once_more_if_slow(init, shutdown)
    assert calls == ["init", "shutdown", "init"]


def test_a_ray_head_that_does_not_answer_is_one_line_at_once(tmp_path):
    """--ray-address / RAY_ADDRESS of a head that is not there: ray.init retried it for minutes, repeating Ray's own
    warnings, and ignored SIGTERM; an address without its port was a ValueError traceback. Said before ray.init
    (jobs/raycluster.py _probe_head); an address Ray resolves itself is left to it."""
    import socket

    from jobs.raycluster import RayJoinError, _probe_token

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the block ends
    cases = {f"127.0.0.1:{port}": f"nothing listens at 127.0.0.1:{port} (Connection refused)",
             "no-such-head.invalid:6379": "the name 'no-such-head.invalid' does not resolve (",
             "10.0.0.1": "give the head's address as HOST:PORT, its GCS port (6379 unless",
             ":6379": "give the head's address as HOST:PORT"}  # fmt: skip
    for address, why in cases.items():
        with pytest.raises(RayJoinError) as info:
            _probe_token(None, address)  # before anything of Ray is asked
        assert str(info.value).startswith(f"cannot join the Ray cluster at {address}: {why}"), str(info.value)
    for address in ("auto", "ray://head:10001", ""):
        assert _probe_token(None, address) is None  # ray.init's own paths
    proc = subprocess.run([sys.executable, "-m", "jobs.attribute", "--dataset", "stsb", "--limit", "2", "--out",
                           str(tmp_path / "runs"), "-q"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"})  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"jobs.attribute: error: cannot join the Ray cluster at 127.0.0.1:{port}: nothing listens at 127.0.0.1:{port} "
        "(Connection refused) (is its head up? `ray status` on the head prints the address to join)"], proc.stderr


def test_an_address_where_something_else_answers_is_one_line_not_minutes_of_retries(tmp_path, ray_cluster):
    """--ray-address / RAY_ADDRESS where something accepts connections but is no Ray GCS (a web server, the
    dashboard's port): ray.init retried it for minutes, repeating Ray's warnings. Before ray.init, the address gets
    HTTP/2's preface, which a gRPC server answers with its SETTINGS: anything else is one line at once; a real head's
    GCS passes."""
    import socket
    import threading

    from jobs.raycluster import GRPC_ANSWER_TIMEOUT_S, RayJoinError, _probe_token

    _probe_token(ray_cluster, ray_cluster.get_runtime_context().gcs_address)  # the test Ray's head: no error

    def serve(reply: bytes | None) -> tuple[str, socket.socket]:
        server = socket.create_server(("127.0.0.1", 0))

        def answer() -> None:
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                conn.recv(100)
                if reply is not None:
                    conn.sendall(reply)
                    conn.close()  # else: kept open, saying nothing

        threading.Thread(target=answer, daemon=True).start()
        return f"127.0.0.1:{server.getsockname()[1]}", server

    web, web_server = serve(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    silent, silent_server = serve(None)
    try:
        with pytest.raises(RayJoinError) as info:
            _probe_token(None, web)
        assert str(info.value).startswith(f"cannot join the Ray cluster at {web}: {web} answers, but not as a Ray "
                                          "head's GCS (gRPC) does: it said 'HTTP/1.1 400 Bad Request'; the GCS port "
                                          "is 6379"), str(info.value)  # fmt: skip
        t0 = time.monotonic()
        with pytest.raises(RayJoinError) as info:
            _probe_token(None, silent)
        assert f"{silent} accepts connections but does not answer as a Ray head's GCS (gRPC) within" in str(info.value)
        assert time.monotonic() - t0 < GRPC_ANSWER_TIMEOUT_S + 5
        proc = subprocess.run([sys.executable, "-m", "jobs.attribute", "--dataset", "stsb", "--limit", "2", "--out",
                               str(tmp_path / "runs"), "-q", "--ray-address", web], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(
            f"jobs.attribute: error: cannot join the Ray cluster at {web}: {web} answers, but not as"), proc.stderr
    finally:
        web_server.close()
        silent_server.close()


def test_a_job_whose_output_has_no_reader_goes_on_to_its_end(tmp_path):
    """`jobs.attribute ... | head -1`, or started with stdout closed (`>&-`): the first broken write was a traceback
    that stopped the run mid-way (resumable, but not done); the job's result is its store, so it goes on."""
    argv = [sys.executable, "-m", "jobs.attribute", "--dataset", "stsb", "--limit", "3", "--steps", "2",
            "--executor", "local", "--cells", "same-token"]  # fmt: skip
    piped = subprocess.Popen([*argv, "--out", str(tmp_path / "a")], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert piped.stdout.readline()  # the first line, then the reader goes away
    piped.stdout.close()
    assert piped.wait(timeout=600) == 0 and "Traceback" not in piped.stderr.read()
    closed = subprocess.run(["bash", "-c", " ".join(argv + ["--out", str(tmp_path / "b"), ">&-"])], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr[-2000:]
    for out in ("a", "b"):
        (run,) = (tmp_path / out).iterdir()
        assert json.loads((run / "manifest.json").read_text())["tables"]["pairs"]["rows"] == 3


def test_sigterm_stops_a_job_as_ctrl_c_does_in_one_line(tmp_path):
    """`kill`, a scheduler stopping the job, `ray job stop`: SIGTERM ended the job with nothing said (143, or 15
    where ray.init's own handler exits); now the way out of Ctrl-C (xsbert_core.errors.exit_status): the committed
    wave stays, one line, 143, and the same command computes only the rest. (Ray's handler is put back to the
    command's after ray.init: jobs/raycluster.py command_sigterm.)"""
    from jobtools import hooked_attribute

    argv = ["--dataset", "stsb", "--limit", "8", "--steps", "2", "--wave-size", "4", "--executor", "local",
            "--out", str(tmp_path / "runs")]  # fmt: skip
    proc = subprocess.Popen(hooked_attribute(*argv, hold_after_wave=1), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert "wave 1/2" in proc.stdout.readline()  # committed; the driver holds before the second wave
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        proc.kill()
    assert proc.stderr.read().strip().splitlines() == [
        "jobs.attribute: terminated (SIGTERM): the committed waves stay, the wave in progress was removed; the same "
        "command resumes"]  # fmt: skip
    again = subprocess.run([sys.executable, "-m", "jobs.attribute", *argv, "-q"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0 and re.search(r"computed now +4 pairs", again.stdout), again.stdout + again.stderr


def test_an_out_folder_that_cannot_be_made_is_said_before_the_model_loads(tmp_path, capsys):
    """The model's load (seconds; minutes for a large one) came first, then the store's "cannot open the store"; now
    the --out line, before anything is read (a model that is not there is not even looked for)."""
    from jobs.attribute import cli

    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "a-file" / "runs"
    code = cli(["--dataset", "stsb", "--limit", "2", "--model", str(tmp_path / "no-model"), "--executor", "local",
                "--out", str(out)])  # fmt: skip
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [
        f"jobs.attribute: error: --out {out}: cannot write there (Not a directory)"]


def test_the_console_makes_a_forwarded_worker_traceback_one_line():
    """raycluster.ConsoleLines on lines as Ray forwards a worker's traceback (a prefix per line, colour codes, in
    batches with a blank line between): one line for the block; the lines around it, another worker's included,
    pass unchanged (the real thing: test_job_gpu.py's actor that cannot start)."""
    from jobs.raycluster import ConsoleLines

    who = "\x1b[36m(MapWorker(MapBatches(FactorActor)) pid=7, ip=10.0.0.2)\x1b[0m "
    other = "\x1b[36m(cells pid=8)\x1b[0m wave 2: 40 pairs"
    lines = ["before", f"{who}Exception raised in creation task: The actor died because of an error",
             f"{who}  File \"x.py\", line 1, in __init__", "", f"{who}InputError: no CUDA device here", other,
             f"{who}Traceback (most recent call last):", f"{who}  File \"y.py\", line 2", "after"]  # fmt: skip
    shown = ConsoleLines()
    said = [line for line in (shown(x) for x in lines) if line is not None]
    note = ("(MapWorker(MapBatches(FactorActor)) pid=7, ip=10.0.0.2) a traceback, left out here: the worker's log file "
            "keeps it (Ray's logs folder on its node, /tmp/ray/session_latest/logs by default)")  # fmt: skip
    assert said == ["before", note, other, note, "after"]

    # another process's line in the middle of a traceback: the rest of it is left out still; the worker's next line
    # that is not a traceback's is shown
    lines = [f"{who}Exception raised in creation task: The actor died because of an error", other,
             f"{who}    self._map_transformer.init()", f"{who}             ^^^^^^^^^^", "",
             f"{who}xsbert_core.errors.InputError: no CUDA device here", other, f"{who}KeyError: 'x'", other,
             f"{who}wave 3: 40 pairs", f"{who}  indented, not after a traceback"]  # fmt: skip
    shown = ConsoleLines()
    said = [line for line in (shown(x) for x in lines) if line is not None]
    assert said == [note, other, other, other, f"{who}wave 3: 40 pairs", f"{who}  indented, not after a traceback"]


def test_the_console_keeps_lines_that_threads_print_at_once_whole(monkeypatch):
    """The job's error line and Ray's log monitor (a thread that prints the workers' lines) print at once: print()
    writes a text and its end in two calls, so on a plain stream one line can end up inside another's, where
    ConsoleLines would take the job's error for part of a worker's traceback and leave it out. Through the console's
    WholeLines (quiet_console makes stdout and stderr one) each line comes out whole; a thread's flush still shows a
    line it has not ended (a progress bar's "\\r")."""
    import io
    import threading

    from jobs.console import WholeLines, quiet_console

    raw = io.TextIOWrapper(io.BytesIO(), line_buffering=True)
    stream = WholeLines(raw)

    def say(tag: str) -> None:
        for i in range(2000):
            print(f"({tag}) line {i}", file=stream)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        threads = [threading.Thread(target=say, args=(tag,)) for tag in "abc"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    lines = raw.buffer.getvalue().decode().splitlines()
    assert sorted(lines) == sorted(f"({tag}) line {i}" for tag in "abc" for i in range(2000))

    stream.write("\r 40%")
    assert raw.buffer.getvalue().decode().endswith("line 1999\n")  # not yet: the line is not ended
    stream.flush()
    assert raw.buffer.getvalue().decode().endswith("\r 40%") and stream.isatty() is False  # the rest is raw's

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    quiet_console()
    quiet_console()  # every entry point calls it, some more than once in a process: wrapped once
    assert isinstance(sys.stderr, WholeLines) and isinstance(sys.stdout, WholeLines)
    assert not isinstance(sys.stderr.stream, WholeLines)
