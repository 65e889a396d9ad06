"""UD words of a sentence, aligned to the tokenizer's words (paper section 5.1).

A parser (stanza, or spaCy's en_core_web_sm as offline fallback) gives `ParsedWord`s: text, character
span, UPOS, dependency relation and head. This module

1. reads them from a stanza `Document` (`read_stanza`: UD already) or a spaCy `Doc` (`read_spacy`:
   ClearNLP-style labels, converted to UD by `clearnlp_to_ud`, table `CLEARNLP_TO_UD` below);
2. relabels words inside multi-word expressions and coordinations (`relabel`, list `PHRASE_INTERNAL`);
3. aligns parser words to the tokenizer's words (`xsbert_core.words.words_of`: the `u`/`v` of word
   cells) by character offsets, for WordPiece, BPE and SentencePiece alike (`align`).

Alignment of tokenizer word u with span [s_u, e_u) (whitespace trimmed): P(u) = the parser words whose
span overlaps it, T(p) = the tokenizer words overlapping parser word p.

    one_to_one    P(u) = {p} and T(p) = {u}    upos, deprel and head come from p
    many_to_one   P(u) = {p}, |T(p)| > 1       several tokenizer words inside one parser word
                                               (MiniLM's "u . s ." inside spaCy's "U.S.", "' s" inside "'s")
    one_to_many   |P(u)| > 1                   one tokenizer word over several parser words
                                               (MiniLM's "cannot" over "can" "not", "don" over "do" "n't")
    none          P(u) = {}                    the parser has no word there (or failed on the text)

Only one_to_one words get upos/deprel/head; the others are flagged (`aligned` false) and counted by
the caller, never guessed. A head is the tokenizer word aligned one-to-one with the parser word's head,
or None for a root or a head that is not aligned one-to-one.

No Ray, no files: `jobs.parse` runs the parsers and writes the `parses` table (docs/STORE.md).

spaCy (ClearNLP) -> UD, rules applied by `clearnlp_to_ud` in this order
------------------------------------------------------------------------
1. Label map, `CLEARNLP_TO_UD` (every label en_core_web_sm's parser emits; each with its reason).
2. Prepositions: a `prep`/`agent`/`dative` word (or any word with a `pobj` child) that has an object
   (its `pobj` child, else a non-ADP `pcomp` child) is re-attached as `case` (`mark` when the object
   is a verb: "after leaving") of that object, and the object takes the preposition's place under its
   head h: `obl` when h is a verb, adjective or adverb (VERB/AUX/ADJ/ADV), `nmod` when h is nominal
   (anything else); a verbal object gets `advcl` / `acl`; the object of `agent` ("by") gets
   `obl:agent`; of a preposition that is itself a `root`/`conj`/... the preposition's own relation.
   Objectless prepositions stacked above it ("from under the bed") become `case` of the same object;
   other dependents of the preposition ("right after ...") move to the object. A preposition without
   any object gets `advmod` (UD treats such intransitive prepositions as adverbial modifiers).
3. Copula: UD makes the predicate, not "be", the head. A "be" word (lemma be) that is not an auxiliary
   and has no `expl` ("there is ...") with an `attr`/`acomp` child, or else a prepositional object
   from rule 2 to its right ("is on the mat"), hands its relation and head to that predicate, becomes
   its `cop`, and all its other dependents move to the predicate. `attr` after an expletive "there is"
   is the subject (`nsubj`); `attr`/`acomp` of other verbs ("became a doctor", "looks happy") `xcomp`.
4. Coordination: `cc` moves from the first conjunct to the conjunct that follows it, and chained
   conjuncts (spaCy: "plums" -> "pears" -> "apples") attach to the first conjunct, as in UD.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from .words import Word

Alignment = Literal["one_to_one", "many_to_one", "one_to_many", "none"]
ALIGNMENTS: tuple[Alignment, ...] = ("one_to_one", "many_to_one", "one_to_many", "none")


@dataclass(frozen=True)
class ParsedWord:
    """One parser word: its text and character span [start, end) in the sentence, UPOS, relation, head.

    `head` is the index of the head word in the same parse (all sentences of a text flattened, in
    order), None for a root. `deprel` is in the parser's own scheme (UD for stanza, ClearNLP for raw
    spaCy output until `clearnlp_to_ud`). `xpos` and `lemma` are kept for the conversion.
    """

    text: str
    start: int
    end: int
    upos: str
    deprel: str
    head: int | None
    xpos: str = ""
    lemma: str = ""


# --------------------------------------------------------------------------- readers
def read_stanza(doc: Any) -> list[ParsedWord]:
    """The words of a stanza `Document` (all sentences, flattened); relations are UD already.

    A word of a multi-word token ("don't" -> do, n't) without its own offsets gets its token's span,
    so both words overlap the same characters (and a tokenizer word there aligns one-to-many).
    """
    out: list[ParsedWord] = []
    for sentence in doc.sentences:
        base = len(out)
        for token in sentence.tokens:
            for word in token.words:
                start = word.start_char if word.start_char is not None else token.start_char
                end = word.end_char if word.end_char is not None else token.end_char
                if start is None or end is None:
                    raise ValueError(f"stanza word {word.text!r} has no character offsets")
                head = int(word.head) if word.head is not None else 0
                out.append(
                    ParsedWord(
                        text=word.text,
                        start=int(start),
                        end=int(end),
                        upos=word.upos or "X",
                        deprel=word.deprel or "dep",
                        head=base + head - 1 if head > 0 else None,
                        xpos=word.xpos or "",
                        lemma=word.lemma or "",
                    )  # fmt: skip
                )
    check_tree(out)
    return out


def spacy_words(doc: Any) -> list[ParsedWord]:
    """The tokens of a spaCy `Doc` as spaCy labels them (ClearNLP relations, `ROOT` heads itself -> None)."""
    return [
        ParsedWord(
            text=t.text,
            start=t.idx,
            end=t.idx + len(t.text),
            upos=t.pos_ or "X",
            deprel=t.dep_ or "dep",
            head=None if t.head.i == t.i else t.head.i,
            xpos=t.tag_ or "",
            lemma=t.lemma_ or "",
        )  # fmt: skip
        for t in doc
    ]


def read_spacy(doc: Any) -> list[ParsedWord]:
    """The tokens of a spaCy `Doc`, relations converted to UD (`clearnlp_to_ud`)."""
    return clearnlp_to_ud(spacy_words(doc))


def check_tree(words: Sequence[ParsedWord]) -> None:
    """Raise ValueError unless every head is in range and following heads from any word reaches a root."""
    n = len(words)
    for w in words:
        if w.head is not None and not 0 <= w.head < n:
            raise ValueError(f"head {w.head} of {w.text!r} out of range (0..{n - 1})")
    for k in range(n):
        seen, q = 0, k
        while words[q].head is not None:
            q = words[q].head  # type: ignore[assignment]
            seen += 1
            if seen > n:
                raise ValueError(f"cycle in the dependency tree through {words[k].text!r}")


# --------------------------------------------------------------------------- spaCy -> UD
# Every label of en_core_web_sm's parser (`nlp.get_pipe("parser").labels`), its UD relation and why.
# "rule N" refers to the module docstring; the label given is the one used where the rule does not apply.
CLEARNLP_TO_UD: dict[str, tuple[str, str]] = {
    "ROOT": ("root", "the root of the sentence"),
    "acl": ("acl", "same relation: clausal modifier of a noun (reduced relatives, infinitival modifiers)"),
    "acomp": ("xcomp", "adjectival complement: the predicate under a copula (rule 3), else xcomp ('looks happy')"),
    "advcl": ("advcl", "same relation: adverbial clause"),
    "advmod": ("advmod", "same relation: adverbial modifier"),
    "agent": ("case", "the 'by' of a passive: case of its object, which becomes obl:agent (rule 2)"),
    "amod": ("amod", "same relation: adjectival modifier"),
    "appos": ("appos", "same relation: apposition"),
    "attr": ("xcomp", "predicate nominal: the predicate under a copula (rule 3), nsubj after 'there is', else xcomp"),
    "aux": ("aux", "same relation: auxiliary"),
    "auxpass": ("aux:pass", "passive auxiliary: UD subtype aux:pass"),
    "case": ("case", "same relation: possessive 's"),
    "cc": ("cc", "same relation; UD attaches it to the following conjunct (rule 4)"),
    "ccomp": ("ccomp", "same relation: clausal complement"),
    "compound": ("compound", "same relation: compounds and multi-word names"),
    "conj": ("conj", "same relation; chains are attached to the first conjunct (rule 4)"),
    "csubj": ("csubj", "same relation: clausal subject"),
    "csubjpass": ("csubj:pass", "clausal subject of a passive: UD subtype csubj:pass"),
    "dative": ("iobj", "indirect object ('gave him a book'); a 'to'/'for' with an object is a preposition (rule 2)"),
    "dep": ("dep", "same relation: unclassified dependency"),
    "det": ("det", "same relation: determiner"),
    "dobj": ("obj", "direct object: UD v2 obj"),
    "expl": ("expl", "same relation: expletive ('there is')"),
    "intj": ("discourse", "interjections are discourse elements in UD"),
    "mark": ("mark", "same relation: subordinating marker"),
    "meta": ("dep", "meta modifiers (bracketed asides) have no UD counterpart: unspecified dep"),
    "neg": ("advmod", "negation 'not'/'n't' is an adverbial modifier in UD (det when the word is a determiner)"),
    "nmod": ("nmod", "same relation: nominal modifier"),
    "npadvmod": ("obl:npmod", "bare noun phrase as adverbial ('5 years old'): obl:npmod, nmod:npmod under a noun"),
    "nsubj": ("nsubj", "same relation: nominal subject"),
    "nsubjpass": ("nsubj:pass", "subject of a passive: UD subtype nsubj:pass"),
    "nummod": ("nummod", "same relation: numeric modifier"),
    "oprd": ("xcomp", "object predicate ('made him happy', 'was elected president'): xcomp"),
    "parataxis": ("parataxis", "same relation: parataxis"),
    "pcomp": ("ccomp", "complement of a preposition: takes the preposition's place (rule 2); else ccomp"),
    "pobj": ("obl", "object of a preposition: obl under a verb/adjective/adverb, nmod under a noun (rule 2)"),
    "poss": ("nmod:poss", "possessive modifier: UD subtype nmod:poss"),
    "preconj": ("cc:preconj", "first part of a paired conjunction ('either'): UD subtype cc:preconj"),
    "predet": ("det:predet", "predeterminer ('all the boys'): UD subtype det:predet"),
    "prep": ("case", "preposition: re-attached as case (or mark) of its object (rule 2); advmod without object"),
    "prt": ("compound:prt", "verb particle ('pick up'): UD compound:prt"),
    "punct": ("punct", "same relation: punctuation"),
    "quantmod": ("advmod", "modifier of a quantity ('about 5', 'more than'): advmod"),
    "relcl": ("acl:relcl", "relative clause: UD subtype acl:relcl"),
    "xcomp": ("xcomp", "same relation: open clausal complement"),
}

_PREP_LABELS = frozenset({"prep", "agent", "dative"})
_CLAUSAL_HEAD_POS = frozenset({"VERB", "AUX", "ADJ", "ADV"})  # obl under these, nmod under the rest
_VERBAL_POS = frozenset({"VERB", "AUX"})
_BE_FORMS = frozenset({"be", "am", "is", "are", "was", "were", "been", "being", "'s", "'re", "'m"})


def _is_be(w: ParsedWord) -> bool:
    return w.lemma.lower() == "be" if w.lemma else w.text.lower() in _BE_FORMS


def clearnlp_to_ud(words: Sequence[ParsedWord]) -> list[ParsedWord]:
    """spaCy's ClearNLP-style tree -> a UD tree over the same words (rules 1-4 of the module docstring).

    Unknown labels raise ValueError (the caller checks a model's labels against CLEARNLP_TO_UD first).
    """
    n = len(words)
    raw = [w.deprel for w in words]
    unknown = sorted({d for d in raw if d not in CLEARNLP_TO_UD})
    if unknown:
        raise ValueError(f"no UD mapping for spaCy labels {unknown}")
    raw_head = [w.head for w in words]
    children: list[list[int]] = [[] for _ in range(n)]
    for k, h in enumerate(raw_head):
        if h is not None:
            children[h].append(k)
    head: list[int | None] = list(raw_head)
    dep = [CLEARNLP_TO_UD[d][0] for d in raw]

    # Rule 1 details that depend on the word: neg on a determiner ("no"), npadvmod under a noun.
    for k in range(n):
        if raw[k] == "neg" and words[k].upos == "DET":
            dep[k] = "det"
        if raw[k] == "npadvmod" and raw_head[k] is not None and words[raw_head[k]].upos not in _CLAUSAL_HEAD_POS:
            dep[k] = "nmod:npmod"

    # Rule 2: prepositions become case markers of their objects.
    def object_of(p: int) -> int | None:
        for c in children[p]:
            if raw[c] == "pobj":
                return c
        for c in children[p]:
            if raw[c] == "pcomp" and words[c].upos != "ADP":
                return c
        return None

    # A dative is a preposition only as 'to'/'for' (ADP); "gave *her* a book" is a noun phrase (iobj).
    prep_like = [
        (raw[k] in _PREP_LABELS and (raw[k] != "dative" or words[k].upos == "ADP"))
        or any(raw[c] == "pobj" for c in children[k])
        for k in range(n)
    ]
    from_prep = [False] * n  # objects that took a preposition's place (copula candidates, rule 3)
    absorbed = [False] * n  # objectless prepositions made case of an object below them
    for p in range(n):
        if not prep_like[p]:
            continue
        o = object_of(p)
        if o is None:
            continue
        markers = [p]
        h = raw_head[p]
        top = p  # the highest preposition of the stack: its relation and head are the object's
        while h is not None and prep_like[h]:
            o2 = object_of(h)
            if o2 is not None:  # a preposition attached to another one's phrase: attach to that object
                h = o2
                break
            markers.append(h)
            top = h
            h = raw_head[h]
        verbal = words[o].upos in _VERBAL_POS and raw[o] == "pcomp"
        if raw[top] == "agent":
            label = "obl:agent"
        elif raw[top] in _PREP_LABELS:
            clausal = h is not None and words[h].upos in _CLAUSAL_HEAD_POS
            label = ("advcl" if clausal else "acl") if verbal else ("obl" if clausal else "nmod")
        else:  # a preposition that is itself root, conj, advmod, ...: its object takes that relation
            label = dep[top]
        head[o], dep[o] = h, label
        from_prep[o] = raw[top] in _PREP_LABELS
        for m in markers:
            head[m], dep[m] = o, ("mark" if verbal else "case")
            absorbed[m] = True
            for c in children[m]:  # "right after the war": right -> war
                if c != o and c not in markers and head[c] == m:
                    head[c] = o
    for p in range(n):
        if prep_like[p] and not absorbed[p] and raw[p] in _PREP_LABELS:  # (a noun-phrase dative is not prep_like)
            dep[p] = "advmod"  # no object anywhere below: an intransitive preposition

    # Rule 3: copula. attr/acomp after "there is" -> nsubj; of other verbs -> xcomp (the map's default).
    predicate: dict[int, int] = {}
    for v in range(n):
        kids = children[v]
        preds = [c for c in kids if raw[c] in ("attr", "acomp")]
        if any(raw[c] == "expl" for c in kids):
            for c in preds:
                if raw[c] == "attr":
                    dep[c] = "nsubj"
            continue
        if not _is_be(words[v]) or raw[v] in ("aux", "auxpass"):
            continue
        if any(raw[c] in ("dobj", "ccomp", "xcomp", "oprd") for c in kids):
            continue
        if not preds:
            preds = [c for c in range(v + 1, n) if from_prep[c] and head[c] == v]
        if preds:
            predicate[v] = preds[0]

    def top_of(k: int | None) -> int | None:  # a copula's place is taken by its predicate
        seen = 0
        while k is not None and k in predicate and seen <= n:
            k, seen = predicate[k], seen + 1
        return k

    new_head = list(head)
    new_dep = list(dep)
    for v, c in predicate.items():
        new_head[c], new_dep[c] = top_of(head[v]), dep[v]
        new_head[v], new_dep[v] = c, "cop"
    for k in range(n):
        if k not in predicate and new_head[k] in predicate and predicate[new_head[k]] != k:  # type: ignore[operator]
            new_head[k] = top_of(new_head[k])
    head, dep = new_head, new_dep

    # Rule 4: coordination. cc -> the following conjunct of its head; conj chains -> the first conjunct.
    for k in range(n):
        if dep[k] == "cc" and head[k] is not None:
            later = [c for c in range(k + 1, n) if head[c] == head[k] and dep[c] == "conj"]
            if later:
                head[k] = later[0]
    for k in range(n):
        if dep[k] == "conj":
            h, seen = head[k], 0
            while h is not None and dep[h] == "conj" and head[h] is not None and seen <= n:
                h, seen = head[h], seen + 1
            head[k] = h

    out = [replace(w, deprel=dep[k], head=head[k]) for k, w in enumerate(words)]
    check_tree(out)
    return out


# --------------------------------------------------------------------------- relabelling
# Relations inside a phrase whose words act together as one unit (paper section 5.1): a word with one
# of these (or a subtype: flat:name, compound:prt, ...) takes the relation of its nearest ancestor
# that has none of them, so "New York" as an object is obj/obj and "apples and oranges" obj/obj.
PHRASE_INTERNAL: dict[str, str] = {
    "fixed": "grammaticalized multi-word expressions ('because of', 'as well as'): one function word",
    "flat": "headless names and dates ('New York', 'John Smith'): one name",
    "compound": "compounds ('ice cream', spaCy's 'New York City') and verb particles (compound:prt, 'pick up')",
    "conj": "later conjuncts of a coordination play the role of the first conjunct",
    "goeswith": "parts of one word split by a typo ('with out'): one word",
}


def relabel(words: Sequence[ParsedWord]) -> list[str]:
    """Each word's relation after relabelling: the relation of its nearest ancestor-or-self whose relation
    is not phrase-internal (`PHRASE_INTERNAL`, base relation before ':'); a phrase-internal chain that
    reaches the root keeps the last relation seen."""
    out = []
    for w in words:
        cur, seen = w, 0
        while cur.deprel.split(":")[0] in PHRASE_INTERNAL and cur.head is not None and seen <= len(words):
            cur, seen = words[cur.head], seen + 1
        out.append(cur.deprel)
    return out


# --------------------------------------------------------------------------- alignment
@dataclass(frozen=True)
class AlignedWord:
    """Tokenizer word u with what the parser says about it (upos/deprel/head only when one_to_one)."""

    u: int
    word: str
    alignment: Alignment
    upos: str | None = None
    deprel: str | None = None  # after relabelling
    deprel_raw: str | None = None  # the parser's UD relation (converted for spaCy), before relabelling
    head: int | None = None  # u of the head word; None for a root or a head not aligned one-to-one
    parser_word: int | None = None  # index of the parser word (one_to_one only)

    @property
    def aligned(self) -> bool:
        return self.alignment == "one_to_one"


def word_spans(text: str, words: Sequence[Word], offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Character span [start, end) of each tokenizer word: its tokens' offsets, whitespace trimmed
    (as `words_of` trims the word's text)."""
    spans = []
    for w in words:
        s = min(offsets[i][0] for i in w.tokens)
        e = max(offsets[i][1] for i in w.tokens)
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        spans.append((s, e))
    return spans


def align(
    text: str, words: Sequence[Word], offsets: Sequence[tuple[int, int]], parsed: Sequence[ParsedWord] | None
) -> list[AlignedWord]:
    """Align the tokenizer's words (from `words_of`, with the token offsets) to a UD parse by character
    overlap; one AlignedWord per tokenizer word, in order. `parsed=None` (the parser failed): all none."""
    spans = word_spans(text, words, offsets)
    if parsed is None:
        return [AlignedWord(u=u, word=w.text, alignment="none") for u, w in enumerate(words)]
    length = max([len(text)] + [e for _, e in spans] + [p.end for p in parsed])
    at: list[list[int]] = [[] for _ in range(length)]  # parser words covering each character
    for k, p in enumerate(parsed):
        for c in range(max(0, p.start), p.end):
            at[c].append(k)
    overlaps: list[list[int]] = []  # P(u), in parser order
    covering: dict[int, list[int]] = {}  # T(p)
    for u, (s, e) in enumerate(spans):
        ks = sorted({k for c in range(s, e) for k in at[c]})
        overlaps.append(ks)
        for k in ks:
            covering.setdefault(k, []).append(u)
    one: dict[int, int] = {}  # parser word -> tokenizer word, one_to_one pairs
    kinds: list[Alignment] = []
    for u, ks in enumerate(overlaps):
        if not ks:
            kinds.append("none")
        elif len(ks) > 1:
            kinds.append("one_to_many")
        elif len(covering[ks[0]]) > 1:
            kinds.append("many_to_one")
        else:
            kinds.append("one_to_one")
            one[ks[0]] = u
    labels = relabel(parsed)
    out = []
    for u, (w, kind) in enumerate(zip(words, kinds)):
        if kind != "one_to_one":
            out.append(AlignedWord(u=u, word=w.text, alignment=kind))
            continue
        k = overlaps[u][0]
        p = parsed[k]
        out.append(
            AlignedWord(
                u=u,
                word=w.text,
                alignment=kind,
                upos=p.upos,
                deprel=labels[k],
                deprel_raw=p.deprel,
                head=one.get(p.head) if p.head is not None else None,
                parser_word=k,
            )  # fmt: skip
        )
    return out
