"""`xsbert explain`: one pair at a terminal.

The library's part of the `xsbert` command: the explain subcommand (`add_explain_parser`, `explain`) and
`python -m xsbert_core explain ...`. The installed `xsbert` command, with `xsbert sql` beside explain, is
jobs.cli (the jobs layer builds on the library, never the reverse).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from . import __version__
from .errors import XsbertError
from .precision import DEFAULT_PRECISION
from .settings import EngineSettings, add_arguments, from_namespace

EXAMPLE_PAIR = ("A man is playing a guitar on stage.", "Someone performs music with an instrument.")


def _display(token: str) -> str:
    """Readable token: WordPiece '##', BPE 'Ġ' and SentencePiece '▁' markers dropped."""
    return token.replace("##", "").replace("Ġ", "").replace("▁", "") or token


def new_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The top-level `xsbert` parser (--version) and its subcommand set, without subcommands."""
    p = argparse.ArgumentParser(prog="xsbert", description="Token-pair attributions for sentence transformers.")
    p.add_argument("--version", action="version", version=f"xsbert {__version__}")
    return p, p.add_subparsers(dest="command", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The library's own CLI (`python -m xsbert_core`): `explain` only. The `xsbert` command is jobs.cli."""
    p, sub = new_parser()
    add_explain_parser(sub)
    return p


def add_explain_parser(sub: argparse._SubParsersAction) -> None:
    """`xsbert explain`: one pair at a terminal (run by `explain`)."""
    e = sub.add_parser(
        "explain",
        help="attribute the similarity of one pair of texts to token pairs",
        description="Attribute f(a, b) to token pairs: A = P_a^T P_b / (||e(a)|| ||e(b)||). "
        "Without texts, explains a built-in example pair.",
    )
    e.add_argument("text_a", nargs="?", help=f"first text (default: {EXAMPLE_PAIR[0]!r})")
    e.add_argument("text_b", nargs="?", help=f"second text (default: {EXAMPLE_PAIR[1]!r})")
    add_arguments(e, EngineSettings)  # --model ... --exclude-prompt, the engine's settings (xsbert_core/settings.py)
    e.add_argument("--prompt-b", default=None, metavar="TEXT", help="text b's own prompt (a document prompt)")
    e.add_argument("--prompt-name-b", default=None, metavar="NAME", help="text b's own prompt, by name")
    e.add_argument("--words", action="store_true", help="also aggregate to words (mean over tokens)")
    e.add_argument("--top", type=int, default=5, help="how many top cells to print")
    e.add_argument("--json", dest="json_out", metavar="OUT", help="write the full result as JSON")
    e.add_argument("--plot", metavar="OUT.png", help="write a heatmap")
    e.add_argument("--device", default=None, help="torch device (default: cpu)")
    e.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")


def _summary(res, top: int) -> str:
    lines = [
        f"score f(a,b)          {res.score:+.6f}",
        f"sum of attributions   {res.attribution_sum:+.6f}   (+{res.positive_sum:.4f} / {res.negative_sum:.4f})",
        f"converges to          {res.target:+.6f}   error {res.error:+.2e}",
    ]
    if res.settings.get("mode") == "approx":
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


def format_view(res, a: str, b: str, top: int) -> str:
    """What `xsbert explain` prints for a pair (and `xsbert show` for a stored one): the settings, the texts, the
    score, sums, reference terms, errors and the top token (and word) pairs."""
    s = res.settings
    head = (f"model {s.get('model')}  layer {s.get('layer')}/{s.get('n_layers')}  {s.get('mode')}  "
            f"{s.get('similarity')}  {s.get('rule')} N={s.get('steps')}")  # fmt: skip
    if s.get("tolerance") is not None:  # adaptive N: a manifest made before `refine` was a setting doubled
        how = {"double": "doubling"}.get(s.get("refine", "double"), s.get("refine"))
        head += f" to {s['tolerance']:g} by {how} (at most {s.get('max_steps')} nodes)"
    if s.get("precision", DEFAULT_PRECISION) != DEFAULT_PRECISION:
        head += f"  {s['precision']}"
    if s.get("prompt"):
        head += f"  prompt {s['prompt']!r}" + (" (excluded)" if s.get("exclude_prompt") else "")
    return f"{head}\na: {a}\nb: {b}\n{_summary(res, top)}"


def explain(args: argparse.Namespace) -> int:
    if (args.text_a is None) != (args.text_b is None):
        raise XsbertError("give both texts, or none for the built-in example pair")
    a, b = (args.text_a, args.text_b) if args.text_a is not None else EXAMPLE_PAIR
    from .explainer import Explainer  # here: the other commands of `xsbert` need no model (sentence-transformers)

    ex = Explainer.from_settings(EngineSettings(**from_namespace(args, EngineSettings)), device=args.device)
    prompt_b = None
    if args.prompt_b is not None or args.prompt_name_b is not None:
        prompt_b = ex.resolve_prompt(args.prompt_b, args.prompt_name_b)
    res = ex.explain(a, b, words=args.words, prompt_b=prompt_b)
    if not args.quiet:
        print(format_view(res, a, b, args.top))
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


def run(parser: argparse.ArgumentParser, commands: dict[str, Callable[[argparse.Namespace], int]],
        argv: list[str] | None = None) -> int:  # fmt: skip
    """Parse argv and run its subcommand; an XsbertError is one `xsbert: error: ...` line and exit status 2."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parser.parse_args(argv)
    try:
        command = commands.get(args.command)
        return command(args) if command is not None else 1
    except XsbertError as exc:
        print(f"xsbert: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), {"explain": explain}, argv)


if __name__ == "__main__":
    sys.exit(main())
