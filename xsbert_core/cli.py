"""`xsbert explain`: one pair at a terminal.

The library's part of the `xsbert` command: the explain subcommand (`add_explain_parser`, `explain`) and
`python -m xsbert_core explain ...`. The installed `xsbert` command, with `xsbert sql` beside explain, is
jobs.cli (the jobs layer builds on the library, never the reverse).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import __version__
from .console import console_logging
from .errors import CommandParser, InputError, XsbertError, check_text, exit_status
from .precision import DEFAULT_PRECISION
from .settings import EngineSettings, add_arguments, from_namespace

EXAMPLE_PAIR = ("A man is playing a guitar on stage.", "Someone performs music with an instrument.")


def _display(token: str) -> str:
    """Readable token: WordPiece '##', BPE 'Ġ' and SentencePiece '▁' markers dropped."""
    return token.replace("##", "").replace("Ġ", "").replace("▁", "") or token


def new_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The top-level `xsbert` parser (--version) and its subcommand set, without subcommands."""
    p = CommandParser(prog="xsbert", description="Token-pair attributions for sentence transformers.")
    p.add_argument("--version", action="version", version=f"xsbert {__version__}")
    return p, p.add_subparsers(dest="command", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The library's own CLI (`python -m xsbert_core`): `explain` only. The `xsbert` command is jobs.cli."""
    p, sub = new_parser()
    add_explain_parser(sub)
    return p


TOP_CELLS = 5  # the top cells `xsbert explain` and `xsbert show` print


def add_top_argument(parser: argparse.ArgumentParser) -> None:
    """--top, of `xsbert explain` and `xsbert show` (checked by check_top)."""
    parser.add_argument("--top", type=int, default=TOP_CELLS, help=f"how many top cells to print (default {TOP_CELLS})")


def check_top(top: int) -> None:
    if top < 1:
        raise InputError(f"--top must be >= 1, got {top}")


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
    add_top_argument(e)
    e.add_argument("--json", dest="json_out", metavar="OUT", help="write the full result as JSON")
    e.add_argument("--plot", metavar="OUT.png", help="write a heatmap (the suffix picks the format: .svg, .pdf, ...)")
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


def writable_folder(folder: str | Path, what: str, create: bool = False) -> Path:
    """Check, before any work is done, that this user can write files into `folder`: an InputError of one line,
    "<what>: cannot write there (<why>)", if not; `what` names the place as the user gave it ("--out reports/x").

    A folder that exists gets a temporary file written and removed; one that does not, its nearest existing parent
    checked (a folder, writable): nothing is made unless `create`, which makes it (and its parents) now."""
    path = Path(folder).expanduser()
    try:
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        if create or existing == path:
            path.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()
        elif not os.access(existing, os.W_OK | os.X_OK):  # access(2) is false on a read-only file system too
            code = errno.EROFS if os.statvfs(existing).f_flag & os.ST_RDONLY else errno.EACCES
            raise OSError(code, os.strerror(code))
    except OSError as exc:
        raise InputError(f"{what}: cannot write there ({exc.strerror or exc})") from None
    return path


def output_file(file: str | Path, flag: str, image: bool = False) -> Path:
    """The file a flag names, checked before any work: not a folder, its folder writable or one that can be made
    (InputError if not; write_output makes it). `image`: a name without a suffix gets ".png", as matplotlib saves
    it, so that the name returned is the file's; a suffix matplotlib cannot write is an InputError that lists those
    it can."""
    path = Path(file).expanduser()
    what = f"{flag} {file}"
    if path.is_dir():  # before a suffix is added: a folder `out` is not a file `out.png` beside it
        raise InputError(f"{what}: is a directory; give a file name")
    if image:
        from .plots import IMAGE_FORMATS

        if not path.suffix:
            path = path.with_name(f"{path.name}.png")
        elif path.suffix[1:].lower() not in IMAGE_FORMATS:
            raise InputError(f"{what}: {path.suffix} is not an image format (use one of {', '.join(IMAGE_FORMATS)})")
    if path.is_dir():
        raise InputError(f"{what}: is a directory; give a file name")
    writable_folder(path.parent, what)
    return path


def write_output(path: Path, flag: str, write: Callable[[Path], object]) -> None:
    """Make `path`'s folder and run `write(path)`; a failure to write (a full disk, a folder gone since output_file)
    is one line, not a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    except OSError as exc:
        raise XsbertError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None


def save_heatmap(res, path: Path, flag: str, note: str = "") -> None:
    """The token heatmap of an attribution (`xsbert explain --plot`, `xsbert show --png`), titled with its score,
    sum, layer and mode (and `note`)."""
    from .plots import plot_attributions

    title = (f"f(a,b) = {res.score:.3f}   ΣA = {res.attribution_sum:.3f}   layer {res.settings.get('layer')}, "
             f"{res.settings.get('mode')}{note}")  # fmt: skip
    labels_a, labels_b = [_display(t) for t in res.tokens_a], [_display(t) for t in res.tokens_b]
    write_output(path, flag, lambda p: plot_attributions(res.matrix, labels_a, labels_b, p, title))


def explain(args: argparse.Namespace) -> int:
    if (args.text_a is None) != (args.text_b is None):
        raise XsbertError("give both texts, or none for the built-in example pair")
    a, b = (args.text_a, args.text_b) if args.text_a is not None else EXAMPLE_PAIR
    # the texts, and where the results go, checked before the model loads
    for text in (a, b):
        check_text(text)
    check_top(args.top)
    json_out = output_file(args.json_out, "--json") if args.json_out else None
    plot = output_file(args.plot, "--plot", image=True) if args.plot else None
    from .explainer import Explainer  # here: the other commands of `xsbert` need no model (sentence-transformers)
    from .models import transformers_bars

    with transformers_bars(sys.stderr.isatty() and not args.quiet):  # no loading bar in a log or with --quiet
        ex = Explainer.from_settings(EngineSettings(**from_namespace(args, EngineSettings)), device=args.device)
    prompt_b = None
    if args.prompt_b is not None or args.prompt_name_b is not None:
        prompt_b = ex.resolve_prompt(args.prompt_b, args.prompt_name_b)
    res = ex.explain(a, b, words=args.words, prompt_b=prompt_b)
    if not args.quiet:
        print(format_view(res, a, b, args.top))
    if json_out:
        out = res.to_dict()
        out.update(text_a=a, text_b=b)
        out["display_tokens_a"] = [_display(t) for t in res.tokens_a]
        out["display_tokens_b"] = [_display(t) for t in res.tokens_b]
        write_output(json_out, "--json", lambda p: p.write_text(json.dumps(out, indent=1)))
        if not args.quiet:
            print(f"wrote {json_out}")
    if plot:
        save_heatmap(res, plot, "--plot")
        if not args.quiet:
            print(f"wrote {plot}")
    return 0


def run(parser: argparse.ArgumentParser, commands: dict[str, Callable[[argparse.Namespace], int]],
        argv: list[str] | None = None) -> int:  # fmt: skip
    """Parse argv and run its subcommand (exit_status: nothing is written before the end of one). An error is said
    as the subcommand's usage errors are, `xsbert sql: error: ...`."""
    console_logging()
    args = parser.parse_args(argv)
    command = commands.get(args.command)
    return exit_status(f"{parser.prog} {args.command}", lambda: command(args) if command is not None else 1)


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), {"explain": explain}, argv)


if __name__ == "__main__":
    sys.exit(main())
