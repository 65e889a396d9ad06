"""The paper's numbers are typed once (jobs/paper.py): the docs, the sql/ headers and jobs.evaluate agree with it,
the like-for-like rule names every setting that differs, and every quotation of the paper is its own words: each is
checked against the paper's sentences kept in tests/data/paper_sentences.txt (copied word for word from its full
text), and each recorded value's section against the section those sentences come from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jobs import paper
from jobs.evaluation import figures, inputs, table1

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "tests" / "data" / "paper_sentences.txt"
# Quoted phrases in the prose of these files are the paper's words unless listed in NOT_THE_PAPER.
QUOTING_DOCS = ("README.md", "docs/ANALYSES.md", "docs/RESULTS.md")
# Quoted phrases in those docs that are not the paper's: dataset texts, page labels, our own earlier wording, our
# notation for a template, and the like (each a deliberate entry: a new quotation of the paper must be its words).
NOT_THE_PAPER = {
    "On war criminals and heroes: the whitewashing of Ariel Sharon",  # an STS-B text
    "layer: ours 3 of 6, the paper's 9 of 12",  # the report's wording
    "Browse the pairs behind it", "Open the pair",  # the report's links
    "... ugly.", "Not a good idea.", "A good idea.",  # dataset texts
    "tuned, seed 0, H200", "seed 0",  # a row of our table
    "changes which token pairs carry the similarity",  # an earlier version of our page
    "five below the last",  # our phrase
    "≤ 1e-6 relative", "45–93% off",  # a requirement on our cross-check
    "This house is X.",  # our notation for the template; the paper writes This house is beautiful.
    "not", "Not", "cannot", "n't", "not-so-good",  # words the negation dataset tells apart
    "+1", "no correlation", "Faults", "run python -m jobs.parse --run DIR",  # our wording and messages
    "Download the N rows as CSV",  # a link of xsbert serve's pages
}
# Markup the paper's text file carries and a quotation drops: *italics*, $math$, LaTeX symbols, footnote marks.
PLAIN = [(r"\\pm", "±"), (r"\\times", "×"), (r"\\epsilon", "ϵ"), (r"[$*¹²³⁴⁵⁶]", ""), ("’", "'"),
         (r"\s+", " ")]  # fmt: skip
# A number as the paper prints one: 85.8%, 16%, 0.81, 87.5 (not a bare 1 or 0.9 threshold: those are settings).
NUMBER = re.compile(r"\d+\.\d+%|\d+%|\d\.\d\d|\d\d\.\d")
# The number a value's text starts with ("85.8%", "0.81 ± 0.07", "> 0.3").
LEADING = re.compile(r"-?\d+(?:\.\d+)?%?")
# The sql/ file whose header quotes a figure's numbers.
SQL_OF_FIGURE = {"Table 1": "table1.sql", "Fig 2": "reference_terms.sql", "Fig 3": "agreement.sql",
                 "Fig 4": "agreement.sql", "Fig 6": "syntactic_relations.sql", "Fig 8": "negation.sql",
                 "Fig 10": "lexical_ranks_compare.sql"}  # fmt: skip


def plain(text: str) -> str:
    """A sentence as a quotation reads: the paper's markup dropped, whitespace closed up."""
    for pattern, replacement in PLAIN:
        text = re.sub(pattern, replacement, text)
    return text.strip()


def paper_sentences() -> dict[str, str]:
    """{plain sentence: its section, as '§5.1' or 'App. D'} from tests/data/paper_sentences.txt."""
    out = {}
    for line in SENTENCES.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            section, sentence = line.split(" | ", 1)
            out[plain(sentence)] = section.split(",")[0]
    return out


def quotations(text: str) -> list[str]:
    """The phrases in double quotes (straight or curly) of a text."""
    return [a or b for a, b in re.findall(r'"([^"]+)"|“([^”]+)”', text)]


def prose(path: Path) -> str:
    """A Markdown file without its code: fenced and indented blocks and inline code left out."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"^    .*$", "", text, flags=re.M)
    return re.sub(r"`[^`\n]+(?:\n[^`\n]+)*`", "", text)  # inline code, over line breaks but no blank line


def table_numbers() -> set[str]:
    """Every number written anywhere in the table (values, their spreads, the subsets' bounds)."""
    return {n for v in paper.VALUES for field in (v.text, v.subset, v.metric, v.what) for n in NUMBER.findall(field)}


def numeric_values() -> list[paper.PaperValue]:
    return [v for v in paper.VALUES if v.value is not None]


def test_the_table_is_consistent():
    assert len(paper.BY_KEY) == len(paper.VALUES)  # one row per key
    for v in numeric_values():
        first = LEADING.findall(v.text)[0]
        shown = float(first.rstrip("%"))
        assert shown == pytest.approx(100 * v.value if first.endswith("%") else v.value), v.key
        assert "all-mpnet-base-v2" in v.model and v.layer and v.subset and v.metric
    with pytest.raises(KeyError, match="known: table1_shelf"):
        paper.get("fig99")


def test_every_value_cites_its_section_and_sentence():
    """Each value names its section (§ or App.) and says what the paper says: a quotation where word for word, else a
    marked paraphrase; a claim without a number is stated no stronger than the paper's sentence."""
    for v in paper.VALUES:
        assert re.search(r"§\d|App\. [A-Z]", v.section), v.key
        assert v.says.startswith(paper.PARAPHRASE) or v.says.startswith('"'), v.key
        assert len(v.says) > len(paper.PARAPHRASE) + 10, v.key
    claim = paper.get("fig6_same_function")
    assert claim.value is None and "identical syntactic function" in claim.text and "wide range" in claim.text
    assert "regard a wide range of relations" in claim.says and "identical syntactic function" in claim.says
    assert "50%" not in claim.text and "most top word pairs" not in claim.text
    # "not a large share" is said of the ~7% nsubj–nsubj share, not of the same-function pairs
    assert "not a large share" not in claim.text + claim.says
    nsubj = paper.get("fig6_nsubj_share")
    assert nsubj.value == 0.07 and "not a large share of all top attributions" in nsubj.says + nsubj.what
    assert paper.NOT_STATED in nsubj.model and paper.NOT_STATED in nsubj.metric  # which model; which denominator
    # Fig 9's stated result is recorded as the paper states it, beside a template set it does not state
    fig9 = paper.get("fig9_opposites_lower")
    assert fig9.value is None and "only rarely negative" in fig9.text and paper.NOT_STATED in fig9.subset
    doc = paper.__doc__ or ""
    assert "read from the order" not in doc and "not from the paper's full text" not in doc


def test_every_quotation_is_the_papers_words():
    """Each quoted sentence in jobs/paper.py is (part of) a sentence of the paper, word for word, and comes from the
    section the value cites; the sentences file itself is the paper's (each line a section and one sentence)."""
    sentences = paper_sentences()
    assert len(sentences) >= 40
    for v in paper.VALUES:
        found = quotations(v.says) + quotations(v.what)
        assert found or v.says.startswith(paper.PARAPHRASE), v.key
        for quote in found:
            whole = [s for s in sentences if quote in s]
            assert whole, (v.key, quote)  # the paper's words
            sections = {sentences[s] for s in whole}
            assert any(sec in v.section for sec in sections), (v.key, quote, sections, v.section)


def test_the_sections_are_the_papers():
    """The sections of the full text: Table 1 §4.2, Fig 2 §4.3, Fig 3/4 §4.4, Fig 6 §5.1, Fig 8 §5.2, Fig 9 §5.3,
    Fig 10 §5.4 with App. D; Fig 3 is layer eleven; Fig 6 parses all STS test pairs."""
    expected = {"Table 1": "§4.2", "Fig 2": "§4.3", "Fig 3": "§4.4", "Fig 4": "§4.4", "Fig 6": "§5.1",
                "Fig 8": "§5.2", "Fig 9": "§5.3", "Fig 10": "§5.4", "§5.4": "§5.4"}  # fmt: skip
    for v in paper.VALUES:
        assert v.section.split(",")[0] == expected[v.figure], v.key
    assert "App. D" in paper.get("fig10_rank_spearman").section
    assert paper.get("fig3_spearman_top").layer == "11 of 12" and "layer eleven" in paper.get("fig3_spearman_top").says
    assert "1,379" in paper.get("fig6_nsubj_share").subset and "all sentence pairs from the STS test set" in (
        " ".join(paper_sentences()))


def test_docs_quote_the_paper_word_for_word():
    """Every phrase the README, docs/ANALYSES.md and docs/RESULTS.md put in quotation marks (outside code) is the
    paper's words, or one of the few listed as not the paper's."""
    text = " ".join(paper_sentences())
    for name in QUOTING_DOCS:
        for quote in quotations(prose(ROOT / name)):
            q = " ".join(quote.replace("*", "").split())
            assert q in NOT_THE_PAPER or q in text, (name, quote)


def test_settings_as_the_paper_states_them():
    """Fig 2 has no layer; Fig 3/4 compare Exact with Tuned (§4.4); Fig 10 is Exact vs Shelf at level 8 on 148,315
    QQP pairs with N = 100 (App. D); layers the paper does not state are marked assumed; Fig 8 is the total to the
    not token, its size relative to the prediction."""
    for key in ("fig2_ref_sim_near_zero", "fig2_ref_term_below", "table1_shelf"):
        assert paper.get(key).layer == paper.NO_LAYER
    for key in ("fig3_spearman_top", *(v.key for v in paper.VALUES if v.figure == "Fig 4")):
        v = paper.get(key)
        assert v.model == "all-mpnet-base-v2, exact vs tuned (approximate)" and "§4.4" in v.section
        assert paper.NOT_STATED in v.metric  # content tokens and top-k by |value| are ours
    fig10 = paper.get("fig10_rank_spearman")
    assert fig10.model == "all-mpnet-base-v2, exact vs shelf" and fig10.layer == "8 of 12"
    assert "QQP" in fig10.subset and "148,315" in fig10.subset and "N = 100" in fig10.subset
    assert "App. D" in fig10.section and paper.NOT_STATED in fig10.metric  # occurrences or same-token cells
    for key in ("fig6_same_function", "fig6_nsubj_share", "fig8_not_negative_shelf", "fig8_not_relative_exact"):
        assert paper.ASSUMED in paper.get(key).layer
    for key in ("fig8_not_negative_shelf", "fig8_not_negative_exact", "fig8_not_relative_shelf",
                "fig8_not_relative_exact"):
        assert paper.NOT_TOTAL in paper.get(key).metric
    assert {paper.get(k).value for k in ("fig8_not_relative_shelf", "fig8_not_relative_exact")} == {0.08, 0.14}
    assert "stanza" in paper.get("fig6_same_function").subset
    # an assumed layer is never like-for-like, even when ours reads the same
    v = paper.get("fig8_not_negative_shelf")
    assert paper.differences(v, {**v.setting(), "layer": "9 of 12"})[0].startswith("layer: ours 9 of 12")


def test_analyses_md_quotes_the_table():
    """docs/ANALYSES.md: each bold number on a '- Paper:' line is one of the table's, and each numeric value of the
    table is quoted there."""
    text = (ROOT / "docs" / "ANALYSES.md").read_text(encoding="utf-8")
    quoted = [b for line in text.splitlines() if line.lstrip().startswith("- Paper:") or line.startswith("  ")
              for b in re.findall(r"\*\*([^*]+)\*\*", line)]  # fmt: skip
    texts = {v.text for v in paper.VALUES}
    assert quoted and set(quoted) <= texts, set(quoted) - texts
    assert {v.text for v in numeric_values()} <= set(quoted)


def test_sql_headers_quote_the_table():
    """Each sql/ header's 'Paper' block holds its figures' numbers, and no number the table does not have."""
    numbers = table_numbers()
    for figure, name in SQL_OF_FIGURE.items():
        lines = (ROOT / "sql" / name).read_text(encoding="utf-8").splitlines()
        start = next(k for k, line in enumerate(lines) if line.startswith("-- Paper"))
        block = [lines[start]]
        for line in lines[start + 1:]:
            if not line.startswith("--           "):
                break
            block.append(line)
        header = " ".join(block).replace("+-", "±")
        for v in paper.VALUES:
            if v.figure == figure and v.value is not None:
                assert v.text in header, (name, v.key)
        assert set(NUMBER.findall(header)) <= numbers, (name, set(NUMBER.findall(header)) - numbers)


def test_results_md_quotes_the_table():
    """docs/RESULTS.md: the paper column of Table 1, '(paper: X)', "the paper's X → Y" and the parenthesis that
    states the paper's agreement figures use the table's numbers."""
    text = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    # a row of ours and the paper's last: | model ... | ours (one or more columns) | paper |
    rows = {m[0]: m[1] for m in re.findall(r"^\| (shelf|tuned|exact|orig)\b[^|]*\|(?: [^|]+ \|)+ ([0-9.]+) \|$", text,
                                            flags=re.M)}  # fmt: skip
    assert rows == {k: paper.get(f"table1_{k}").text for k in ("shelf", "tuned", "exact", "orig")}
    numbers = table_numbers()
    found = re.findall(r"\(paper: ([0-9.]+%)", text)
    found += [n for pair in re.findall(r"paper's ([0-9.]+) → ([0-9.]+)", text) for n in pair]
    for paren in re.findall(r"the paper \((mpnet[^)]*)\)", text):
        found += NUMBER.findall(paren)
    assert len(found) >= 6 and set(found) <= numbers, set(found) - numbers


def test_stored_evaluate_results_quote_the_table():
    """docs/results/*/table1.md (written by jobs.evaluate): its paper_spearman_x100 column is the table's."""
    for path in sorted((ROOT / "docs" / "results").glob("*/table1.md")):
        lines = [line.split("|")[1:-1] for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
        header, rows = [c.strip() for c in lines[0]], [[c.strip() for c in cells] for cells in lines[1:]]
        assert rows and header[0] == "model" and header[-1] == "paper_spearman_x100", path
        quoted = [(cells[0], float(cells[-1])) for cells in rows if cells[-1]]
        for model, value in quoted:
            assert value == pytest.approx(paper.get(f"table1_{model}").value), (path, model)
        # the paper's number on every row of its protocol (cosine; the last epoch where checkpoints are told apart,
        # as jobs.evaluation.table1 writes it: App. A states no checkpoint rule) and on no other: the second seed's
        # rows, the best-dev epochs and orig's dot product have none
        col = {name: k for k, name in enumerate(header)}

        def on_protocol(cells: list[str]) -> bool:
            checkpoint = cells[col["checkpoint"]] if "checkpoint" in col else "-"  # older tables: one per model
            return (cells[0] in ("shelf", "tuned", "exact", "orig") and cells[col["similarity"]] == "cos"
                    and checkpoint in ("-", inputs.DEFAULT_CHECKPOINT))  # fmt: skip

        assert [m for m, _ in quoted] == [cells[0] for cells in rows if on_protocol(cells)], path


def test_evaluate_reads_the_table():
    assert table1.PAPER_TABLE1 == {k: paper.get(f"table1_{k}").value for k in ("shelf", "tuned", "exact", "orig")}
    assert [v for v, _ in [(p[1], p[0]) for p in figures.PAPER_FIG4.values()]] == [0.83, 0.60]
    assert list(figures.PAPER_FIG3.values()) == [(0, paper.get("fig3_spearman_top").value)]


def test_like_for_like_names_what_differs():
    v = paper.get("fig2_ref_sim_near_zero")
    same = v.setting()
    assert paper.differences(v, same) == []
    assert "; like-for-like (all-mpnet-base-v2 shelf, layer -, STS-B test" in paper.beside(v, same)
    ours = {**same, "model": "all-MiniLM-L6-v2 shelf", "layer": "3 of 6"}
    text = paper.beside(v, ours)
    assert text == ("Fig 2: 85.8% of the reference similarities f(a, r_b), f(b, r_a) within ±0.1 of 0; not "
                    "like-for-like: model: ours all-MiniLM-L6-v2 shelf, the paper's all-mpnet-base-v2 shelf; layer: "
                    "ours 3 of 6, the paper's -")  # fmt: skip
    # A setting the paper does not state, or that we assume, is never like-for-like, even for equal strings.
    fig6 = paper.get("fig6_nsubj_share")
    assert [d.split(":")[0] for d in paper.differences(fig6, fig6.setting())] == ["model", "layer", "metric"]


def test_readme_and_analyses_state_fig6_as_the_paper_does():
    """The README's and ANALYSES' Fig 6 sentences say "not a large share" of the ~7% nsubj–nsubj share, as the paper
    does, not of the same-function pairs, and set no majority claim against the paper; the Fig 8 and Fig 3 values
    they name are the table's."""
    nsubj = paper.get("fig6_nsubj_share").text
    for name in ("README.md", "docs/ANALYSES.md", "docs/RESULTS.md"):
        text = " ".join((ROOT / name).read_text(encoding="utf-8").replace("**", "").split())
        assert "most top word pairs" not in text and "mostly join" not in text, name
        assert f"nsubj–nsubj, around {nsubj}" in text, name  # the share is the subject pairs', as the paper's
        for m in re.finditer("not a large share", text):
            before = text[max(0, m.start() - 300):m.start()]
            assert nsubj in before and "33%" not in before[-80:], (name, before[-120:])
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"Exact vs Tuned at layer eleven: {paper.get('fig3_spearman_top').value:.2f}" in readme


# The rows of the results table (README.md, and docs/RESULTS.md's opening) by the start of their first cell, and the
# jobs.paper values each row's "the paper's" column must hold.
TABLE_ROWS = {
    "Table 1: Spearman × 100 of the shelf model": ["table1_shelf"],
    "Table 1: tuned, exact, orig": ["table1_tuned", "table1_exact", "table1_orig"],
    "Fig 2:": ["fig2_ref_sim_near_zero", "fig2_ref_term_below"],
    "Fig 3:": ["fig3_spearman_top"],
    "Fig 4:": ["fig4_spearman_l10", "fig4_spearman_l9", "fig4_pearson_l8", "fig4_jaccard_top10_l11",
               "fig4_jaccard_top10_l8"],
    "Fig 6:": ["fig6_nsubj_share"],
    "Fig 8: *not* attributed negatively": ["fig8_not_negative_shelf"],
    "Fig 8: \\|not\\|": ["fig8_not_relative_shelf"],
    "Fig 8: the exact model": ["fig8_not_negative_exact"],
    "§5.4:": ["s54_places_above", "s54_usa", "s54_europe"],
    "Fig 10,": ["fig10_rank_spearman"],
}


def results_table(text: str) -> list[list[str]]:
    """The body rows (cells stripped) of the Markdown table whose header begins `| the paper's result |`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| the paper's result |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_the_results_table_holds_the_papers_numbers_and_is_the_same_in_readme_and_results():
    """The README's table of results beside the paper's quotes jobs.paper's numbers in its paper column (each row
    whose result the table types), and docs/RESULTS.md opens with the very same table: one statement of each."""
    readme = results_table((ROOT / "README.md").read_text(encoding="utf-8"))
    results = results_table((ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8"))
    assert readme == results
    for start, keys in TABLE_ROWS.items():
        (row,) = [r for r in readme if r[0].startswith(start)]
        for key in keys:
            assert paper.get(key).text.split(" (")[0] in row[1], (start, key, row[1])
    statuses = {"reproduced", "consistent", "partly", "depends on the reading", "differs", "not yet run"}
    assert {r[3] for r in readme} <= statuses
    assert len(readme) >= len(TABLE_ROWS)


def test_nothing_calls_best_dev_the_papers_choice():
    """The paper's App. A states no checkpoint rule: the last epoch is the model, best-dev our option, never "the paper's
    choice"."""
    for name in ("README.md", "docs/RESULTS.md", "docs/ANALYSES.md", "jobs/train.py", "jobs/evaluate.py",
                 *(f"jobs/{d}/{f.name}" for d in ("evaluation", "training") for f in (ROOT / "jobs" / d).glob("*.py")),
                 "xsbert_core/training.py", "bench/paper_gpu.py"):
        text = " ".join((ROOT / name).read_text(encoding="utf-8").split())
        assert "the paper's choice" not in text and "the paper keeps the best dev" not in text, name
    assert inputs.DEFAULT_CHECKPOINT == "last-epoch" and not hasattr(inputs, "PAPER_CHECKPOINT")
