"""`xsbert explain`, run in-process through jobs.cli.main(argv) (the `xsbert` command) with the real
all-MiniLM-L6-v2; the library's own explain CLI (xsbert_core.cli.main, `python -m xsbert_core`) as well."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jobs.cli import main
from xsbert_core import Explainer
from xsbert_core.cli import EXAMPLE_PAIR
from xsbert_core.cli import main as library_main

A = "A man is playing a guitar."
B = "Someone plays an instrument."
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def cli_json(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out.json"
    code = main(["explain", A, B, "--steps", "4", "--layer", "-2", "--json", str(out), "-q"])
    assert code == 0
    return json.loads(out.read_text())


def test_json_has_every_field(cli_json, minilm):
    d = cli_json
    for key in ("tokens_a", "tokens_b", "matrix", "score", "attribution_sum", "ref_sim_a", "ref_sim_b",
                "ref_term", "error", "settings"):
        assert key in d, key
    tok = minilm[0].tokenizer
    assert d["tokens_a"] == tok.convert_ids_to_tokens(tok(A)["input_ids"])  # the tokenizer's own strings
    assert d["tokens_b"] == tok.convert_ids_to_tokens(tok(B)["input_ids"])
    assert d["tokens_a"][0] == "[CLS]" and d["tokens_a"][-1] == "[SEP]"
    m = np.array(d["matrix"])
    assert m.shape == (len(d["tokens_a"]), len(d["tokens_b"]))
    assert d["attribution_sum"] == pytest.approx(float(m.sum()), abs=1e-9)
    assert d["error"] == pytest.approx(d["attribution_sum"] - d["target"], abs=1e-12)
    assert -1.0 <= d["score"] <= 1.0
    assert d["settings"]["steps"] == 4 and d["settings"]["layer"] == 4 and d["settings"]["n_layers"] == 6
    assert d["settings"]["mode"] == "approx" and d["settings"]["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert d["text_a"] == A and d["text_b"] == B
    assert "words_a" not in d  # only with --words


def test_json_equals_the_library(cli_json, minilm):
    res = Explainer(minilm, layer=-2, steps=4).explain(A, B)
    np.testing.assert_allclose(np.array(cli_json["matrix"]), res.matrix, rtol=1e-5, atol=1e-8)
    for key in ("score", "attribution_sum", "ref_sim_a", "ref_sim_b", "ref_term", "error"):
        assert cli_json[key] == pytest.approx(getattr(res, key), rel=1e-5, abs=1e-7), key


def test_words_and_plot(tmp_path, capsys):
    out, png = tmp_path / "w.json", tmp_path / "a.png"
    code = main(["explain", "Unbelievably good guitarists.", B, "--steps", "2", "--layer", "-1", "--words",
                 "--json", str(out), "--plot", str(png), "--mode", "exact"])
    assert code == 0
    d = json.loads(out.read_text())
    assert d["words_a"] == ["Unbelievably", "good", "guitarists", "."]
    assert d["words_b"] == ["Someone", "plays", "an", "instrument", "."]
    assert np.array(d["word_matrix"]).shape == (4, 5)
    assert "un" in d["tokens_a"] and any(t.startswith("##") for t in d["tokens_a"])
    assert d["ref_sim_a"] == 0.0 and d["ref_term"] == 0.0 and d["settings"]["mode"] == "exact"
    data = png.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC)
    printed = capsys.readouterr().out
    assert "score f(a,b)" in printed and "top 5 token pairs" in printed and "word pairs" in printed


@pytest.mark.parametrize("entry", [main, library_main], ids=["xsbert", "xsbert_core"])
def test_default_example_pair(entry, tmp_path, capfd):
    """... and with -q (or stderr not a terminal) nothing on stderr: no "Loading weights" bar of transformers'."""
    out = tmp_path / "d.json"
    assert entry(["explain", "--steps", "1", "--layer", "-1", "--json", str(out), "-q"]) == 0
    d = json.loads(out.read_text())
    assert (d["text_a"], d["text_b"]) == EXAMPLE_PAIR
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["explain", "", "Some text."], "mpty"),
        (["explain", "   ", "Some text."], "mpty"),
        (["explain", "Some text.", "Other.", "--steps", "0"], "steps"),
        (["explain", "Some text.", "Other.", "--layer", "6"], "out of range"),
        (["explain", "Some text.", "Other.", "--rule", "simpson"], "rule"),
        (["explain", "Some text.", "Other.", "--similarity", "l2"], "similarity"),
        (["explain", "only one text"], "both texts"),
        (["explain", "Some text.", "Other.", "--device", "gpu"], "device 'gpu': not a torch device"),
    ],
)
def test_bad_input_exits_2_with_message(argv, needle, capsys, tmp_path):
    out = tmp_path / "never.json"
    code = main(argv + ["--json", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    messages = [line for line in err.splitlines() if line.startswith("xsbert explain: error:")]  # (HF progress bars aside)
    assert len(messages) == 1 and needle in messages[0]
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "flag,name,needle",
    [
        ("--json", "a-file/out.json", "cannot write there (Not a directory)"),
        ("--plot", "a-file/out.png", "cannot write there (Not a directory)"),
        ("--json", "a-folder", "is a directory; give a file name"),
        ("--plot", "a-folder", "is a directory; give a file name"),  # not a-folder.png beside it
        ("--plot", "out.pngg", ".pngg is not an image format (use one of "),
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_before_the_model_loads(flag, name, needle, capsys, tmp_path):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    code = main(["explain", "a", "b", "--model", str(tmp_path / "no-model-here"), flag, str(tmp_path / name)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"xsbert explain: error: {flag} {tmp_path / name}: {needle}")
    assert len(err.splitlines()) == 1  # not the model's error: the output is checked first


@pytest.mark.parametrize("top", ["0", "-1"])
def test_a_top_below_one_is_one_line_before_the_model_loads(top, capsys, tmp_path):
    """As in `xsbert show`: --top -1 would print every cell but one (a Python slice), 0 none."""
    code = main(["explain", "a", "b", "--model", str(tmp_path / "no-model-here"), "--top", top])
    assert code == 2 and capsys.readouterr().err == f"xsbert explain: error: --top must be >= 1, got {top}\n"


@pytest.mark.parametrize("a,b", [("", "b"), ("a", " \t\n")])
def test_an_empty_text_is_one_line_before_the_model_loads(a, b, capsys, tmp_path):
    code = main(["explain", a, b, "--model", str(tmp_path / "no-model-here")])
    err = capsys.readouterr().err
    assert code == 2 and err == "xsbert explain: error: Empty or whitespace-only text cannot be attributed\n"


def test_a_text_of_bytes_that_are_not_utf8_is_one_line_before_the_model_loads(capsys, tmp_path):
    """A shell's $'caf\\xff' reaches argv as a lone surrogate (surrogateescape); no tokenizer takes it."""
    code = main(["explain", "caf\udcff bad", "b", "--model", str(tmp_path / "no-model-here")])
    err = capsys.readouterr().err
    assert code == 2 and err == "xsbert explain: error: Text cannot be attributed: not UTF-8 text (byte 0xff at character 3)\n"


def test_a_plot_without_a_suffix_is_a_png_and_says_so(tmp_path, capsys):
    assert main(["explain", "a", "b", "--steps", "1", "--layer", "-1", "--plot", str(tmp_path / "sub" / "heat")]) == 0
    assert (tmp_path / "sub" / "heat.png").read_bytes()[:8] == PNG_MAGIC  # its folder made, matplotlib's suffix
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path / 'sub' / 'heat.png'}"


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    """Every `xsbert` command runs under run(): a Ctrl-C (KeyboardInterrupt) in it is one line, not a traceback."""
    from xsbert_core.cli import build_parser, run

    def interrupted(args):
        raise KeyboardInterrupt

    assert run(build_parser(), {"explain": interrupted}, ["explain"]) == 130
    assert capsys.readouterr().err == "xsbert explain: interrupted\n"


def test_every_command_exits_through_exit_status(capsys):
    """xsbert_core.errors.exit_status, the way out of every command (jobs.* and xsbert): a summary is exit 0, an int
    is the status, an error raised on purpose one `PROG: error:` line and 2, Ctrl-C one line and 130 with what
    stays, and any other exception is not swallowed (a bug keeps its traceback)."""
    from xsbert_core.errors import InputError, exit_status

    def raises(exc):
        def body():
            raise exc
        return body

    assert exit_status("jobs.x", lambda: {"pairs": 3}) == 0 and exit_status("jobs.x", lambda: 1) == 1
    assert capsys.readouterr().err == ""
    assert exit_status("jobs.x", raises(InputError("bad --steps"))) == 2
    assert capsys.readouterr().err == "jobs.x: error: bad --steps\n"
    assert exit_status("jobs.x", raises(KeyboardInterrupt()), interrupted="the committed waves stay") == 130
    assert capsys.readouterr().err == "jobs.x: interrupted: the committed waves stay\n"
    assert exit_status("jobs.b", raises(OSError("disk")), errors=(OSError,)) == 2
    with pytest.raises(ZeroDivisionError):
        exit_status("jobs.x", raises(ZeroDivisionError()))


COMMANDS = [("jobs.cli", "main", "xsbert"), ("xsbert_core.cli", "main", "xsbert"),
            *((f"jobs.{m}", "parse_args", f"python -m jobs.{m}") for m in ("attribute", "parse", "report", "evaluate",
                                                                          "bundle", "pipeline", "train")),
            ("jobs.store.upgrade", "main", "python -m jobs.store.upgrade"),
            ("jobs._duckdb_cli", "main", "python -m jobs._duckdb_cli")]  # fmt: skip


@pytest.mark.parametrize(("module", "function", "prog"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_usage_error_is_one_line_in_every_command(module, function, prog, capsys):
    """argparse's usage block (30 lines for jobs.attribute) is not printed before the error: one line, status 2."""
    import importlib

    with pytest.raises(SystemExit) as info:
        getattr(importlib.import_module(module), function)(["--no-such-flag"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    name = prog.removeprefix("python -m ")  # the prefix of the command's other errors too
    assert err.startswith(f"{name}: error: ") and err.endswith(f" (see {prog} --help)\n"), err
    assert "--no-such-flag" in err or "arguments are required" in err, err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [["explain", "a", "b"], ["sql", "--run", "r", "select 1"], ["serve", "--run", "r"],
                                  ["show", "--run", "r", "--pair", "p"]], ids=lambda argv: argv[0])  # fmt: skip
def test_a_flag_a_sub_command_does_not_know_is_said_by_that_sub_command(argv, capsys):
    """argparse said it as the top command's (`xsbert: error: unrecognized arguments`), whose --help does not list
    the sub-command's flags."""
    from jobs.cli import main

    with pytest.raises(SystemExit) as info:
        main([*argv, "--no-such-flag", "x"])
    assert info.value.code == 2
    assert capsys.readouterr().err == (f"xsbert {argv[0]}: error: unrecognized arguments: --no-such-flag x "
                                       f"(see xsbert {argv[0]} --help)\n")  # fmt: skip


def test_every_parser_is_a_command_parser():
    """Each command's parser is xsbert_core.errors.CommandParser (a new one with argparse's own would print its usage
    block again); the offline bundle's install.py alone keeps argparse's, as it runs before anything is installed."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    plain = [str(f.relative_to(root)) for d in ("jobs", "xsbert_core") for f in sorted((root / d).rglob("*.py"))
             if "argparse.ArgumentParser(" in f.read_text(encoding="utf-8")]  # fmt: skip
    assert plain == ["jobs/bundling/installer.py"]


def test_unknown_model_exits_2(capsys, tmp_path):
    code = main(["explain", "a", "b", "--model", str(tmp_path / "no-model-here"), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "xsbert explain: error:" in err and "Traceback" not in err


def test_argparse_rejects_bad_choices(capsys):
    with pytest.raises(SystemExit) as info:
        main(["explain", "a", "b", "--mode", "tuned"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_library_cli_is_explain_only(capsys):
    """xsbert_core.cli offers explain; `sql` (jobs.sqlrun) belongs to the jobs layer's `xsbert` (jobs.cli)."""
    code = library_main(["explain", "only one text"])
    assert code == 2 and "xsbert explain: error: give both texts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        library_main(["sql", "--run", "runs/x", "select 1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "invalid choice" in err and "sql" in err
