"""Built-in datasets generated from code: `--dataset negation` and `--dataset adjectives` (docs/ANALYSES.md).

    negation    each STS-B sentence (bundled copy, --split, default test) with exactly one standalone
                "not", paired with the same sentence without it:  text_a = with "not", text_b = without
    adjectives  the paper's 23 adjective triplets (anchor, synonym, opposite) in TEMPLATES, two pairs per
                triplet and template: anchor-synonym and anchor-opposite, with the pass-through columns
                triplet, kind, template (kept in the run's `pairs` table)

Both return rows with the columns the job recognises (pair_id, sentence1, sentence2) plus their
pass-through columns; they have no gold label.
"""

from __future__ import annotations

import csv
import gzip
import re

import pandas as pd

# Paper Table 2 (docs/DESIGN.md §4): anchor, synonym, opposite.
TRIPLETS: tuple[tuple[str, str, str], ...] = (
    ("beautiful", "pretty", "ugly"), ("ugly", "hideous", "beautiful"), ("small", "little", "big"),
    ("big", "huge", "small"), ("gigantic", "enormous", "tiny"), ("tiny", "minuscule", "enormous"),
    ("old", "elderly", "young"), ("young", "youthful", "old"), ("difficult", "hard", "easy"),
    ("simple", "easy", "difficult"), ("thorough", "comprehensive", "erroneous"),
    ("faulty", "erroneous", "thorough"), ("dirty", "messy", "clean"), ("clean", "tidy", "dirty"),
    ("heavy", "massive", "light"), ("common", "normal", "unusual"), ("untypical", "unusual", "normal"),
    ("boring", "dull", "interesting"), ("exciting", "interesting", "boring"), ("calm", "peaceful", "hectic"),
    ("chaotic", "hectic", "calm"), ("balanced", "equal", "uneven"), ("unequal", "uneven", "balanced"),
)  # fmt: skip

# X is the adjective. The first is App. C's example sentence (the paper names no template: assumed); the others
# vary the sentence length, the adjective's position (last word before the period vs inside the sentence), tense and
# subject, so that a finding is not an artefact of one context. Every adjective of TRIPLETS reads as a predicate in
# each.
TEMPLATES: tuple[str, ...] = (
    "This house is X.",
    "It is X.",
    "The report seemed X to everyone who read it.",
    "We all agreed that the whole thing was X.",
)

ADJECTIVE_COLUMNS: tuple[str, ...] = ("triplet", "kind", "template")

# A standalone "not": the whole word, not part of "cannot", "not-so-good" or "n't".
STANDALONE_NOT = re.compile(r"(?<![\w'’-])not(?![\w'’-])", re.IGNORECASE)


def adjective_pairs() -> pd.DataFrame:
    """23 triplets x len(TEMPLATES) x (synonym, opposite) pairs; pair_id 't<k>:<anchor>:<kind>'."""
    rows = []
    for k, template in enumerate(TEMPLATES):
        for anchor, synonym, opposite in TRIPLETS:
            for kind, other in (("synonym", synonym), ("opposite", opposite)):
                rows.append(
                    {
                        "pair_id": f"t{k}:{anchor}:{kind}",
                        "sentence1": template.replace("X", anchor),
                        "sentence2": template.replace("X", other),
                        "triplet": f"{anchor}/{synonym}/{opposite}",
                        "kind": kind,
                        "template": template,
                    }
                )
    return pd.DataFrame(rows, dtype=object)


def remove_not(text: str) -> str | None:
    """The text without its one standalone "not" (and one space next to it); None unless exactly one.

    A sentence-initial "Not" passes its capital to the next word: "Not a good idea." -> "A good idea."
    """
    matches = list(STANDALONE_NOT.finditer(text))
    if len(matches) != 1:
        return None
    start, end = matches[0].span()
    if start > 0 and text[start - 1] == " ":
        start -= 1
    elif end < len(text) and text[end] == " ":
        end += 1
    out = text[:start] + text[end:]
    if matches[0].start() == 0 and text[0].isupper() and out:
        out = out[0].upper() + out[1:]
    return out


def negation_pairs(stsb_path: str, split: str = "test") -> pd.DataFrame:
    """Unique STS-B sentences of `split` with exactly one standalone "not", each paired with itself
    without it. pair_id = '<STS-B pair id>:<1|2>' of the sentence's first occurrence."""
    with gzip.open(stsb_path, "rt", encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        rows = [r for r in reader if r["split"] == split]
    seen: set[str] = set()
    out = []
    for r in rows:
        for side in ("1", "2"):
            text = r[f"sentence{side}"]
            if text in seen:
                continue
            seen.add(text)
            without = remove_not(text)
            if without is not None and without.strip():
                pid = ":".join((r["source_file"], r["year"], r["sid"], side))
                out.append({"pair_id": pid, "sentence1": text, "sentence2": without})
    return pd.DataFrame(out, columns=["pair_id", "sentence1", "sentence2"], dtype=object)
