"""How the tokenizer's words align with a parser's words on STS-B test (Fig 6's unaligned share, explained).

Fig 6's analysis labels a word cell by the syntactic functions of its two words, and a word has one only where the
tokenizer's word and the parser's word are the same characters (`xsbert_core.syntax.align`: one_to_one). This counts,
over the unique sentences of an STS-B split, the tokenizer's words by alignment kind, and for the others which
parser words they fall in (many_to_one: several tokenizer words inside one parser word, as "U.S." or "'s") or which
tokenizer words cover several parser words (one_to_many: "don" over "do" and "n't"). It runs the same tokenizer,
word grouping (`xsbert_core.words.words_of`), parser (spaCy's en_core_web_sm, as `jobs.parse` without stanza) and
alignment as a run's parse, without attributing anything:

    python bench/alignment.py --model all-mpnet-base-v2 --out bench/results/alignment-mpnet-stsb-test.json
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import json
import re
from pathlib import Path

from jobs.attribution.inputs import BUNDLED_STSB
from jobs.parsing.choice import SPACY_EXCLUDE, SPACY_MODEL
from xsbert_core.models import resolve_model
from xsbert_core.syntax import align, read_spacy
from xsbert_core.words import words_of


def pattern(text: str) -> str:
    """A parser word's shape, so that numbers and abbreviations group: digits -> 9, letters kept."""
    return re.sub(r"\d+", "9", text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="all-mpnet-base-v2", help="whose tokenizer (a packaged name or a folder)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--top", type=int, default=25, help="how many of the most frequent words per kind to list")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import spacy
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    nlp = spacy.load(SPACY_MODEL, exclude=list(SPACY_EXCLUDE))
    with gzip.open(BUNDLED_STSB, "rt", encoding="utf-8", newline="") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE) if r["split"] == args.split]
    texts = list(dict.fromkeys(t for r in rows for t in (r["sentence1"], r["sentence2"])))
    kinds: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()  # many_to_one: the parser word (shape) they are inside
    over: collections.Counter[str] = collections.Counter()  # one_to_many: the tokenizer word
    sentences_with = 0
    for doc, text in zip(nlp.pipe(texts, batch_size=64), texts):
        enc = tok(text, return_offsets_mapping=True)
        words = words_of(text, enc.word_ids(), enc["offset_mapping"])
        parsed = read_spacy(doc)
        aligned = align(text, words, enc["offset_mapping"], parsed)
        kinds.update(w.alignment for w in aligned)
        sentences_with += any(w.alignment != "one_to_one" for w in aligned)
        for w, word in zip(aligned, words):
            if w.alignment == "many_to_one":
                s = min(enc["offset_mapping"][i][0] for i in word.tokens)
                p = next(p for p in parsed if p.start <= s < p.end)
                inside[pattern(p.text)] += 1
            elif w.alignment == "one_to_many":
                over[w.word] += 1
    total = sum(kinds.values())
    out = {
        "model": args.model, "parser": SPACY_MODEL, "split": args.split, "sentences": len(texts),
        "sentences_with_an_unaligned_word": sentences_with, "words": total,
        "kinds": dict(kinds), "shares": {k: v / total for k, v in kinds.items()},
        "many_to_one_inside": dict(inside.most_common(args.top)),
        "one_to_many_words": dict(over.most_common(args.top)),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: out[k] for k in ("sentences", "words", "kinds", "shares")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
