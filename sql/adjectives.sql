-- adjectives.sql: are synonyms attributed more than opposites?
--
-- Question  In template sentences that differ only in one adjective
--           ("This house is beautiful." / "This house is pretty." /
--           "... ugly."), what attribution does the adjective pair's
--           word cell get, for synonyms vs opposites?
-- Paper     Table 2 (the 23 triplets), Fig 9 (§5.3: attributions of
--           synonym vs opposite adjective pairs, two sentence pairs per
--           triplet "built from the same sentence template"); the paper
--           finds that opposite pairs "generally, do receive lower, but only
--           rarely negative attributions". Which template it used is not
--           stated (App. C's example: "This house is beautiful." / "This
--           house is pretty."): our set of the paper's, "This house is X."
--           for every triplet (46 pairs), is an assumption. The built-in
--           dataset adds three templates (184 pairs): the report gives the
--           46 first, the pooled set as our extension.
-- Inputs    pairs of run, with the pass-through columns triplet, kind,
--           template of the built-in dataset (python -m jobs.attribute
--           --dataset adjectives; a run without them is an error); pairs
--           without a triplet are left out
--           sentences of run: words; word_cells of run: the adjective cell
--           manifest.json of run: config.cells; a run of --cells
--           same-token or none is an error (it lacks the cells)
-- The cell  the two texts' word lists (case-insensitively) have the same
--           length and differ at exactly one position u: the cell is
--           word_cells (u, v = u). Otherwise (not a template pair) u and
--           attribution are null.
-- Grain     one row per adjective pair, by triplet, template, kind.
-- Columns   pair_id, triplet ('anchor/synonym/opposite'), kind ('synonym'
--           | 'opposite'), template (with X for the adjective), word_a
--           (the anchor), word_b, u, attribution (the word cell's value:
--           mean over the two adjectives' tokens; null when pruned by
--           --min-abs), score, attribution_sum,
--           is_repeat (the same two adjectives, template and kind as a
--           pair earlier in triplet order: in Table 2 four opposite pairs
--           come twice, beautiful/ugly, small/big, young/old, dirty/clean;
--           leave these out to count distinct sentence pairs)
-- Params    none
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/adjectives.sql
--           xsbert sql --run runs/<id> --file sql/adjectives.sql

.read sql/lib/cells_guard.sql

-- a run of another dataset stops here, in one line: its pairs have no
-- triplet and kind columns to read (a binder error, otherwise)
set variable adjectives_run = (
    select
        case
            when count(*) = 2 then true
            else error(
                'adjectives.sql needs a run of --dataset adjectives '
                || '(pairs.triplet, pairs.kind); the pairs of run '
                || getvariable('run') || ' have no such columns'
            )
        end as ok,
    from (
        describe select *
        from read_parquet(getvariable('run') || '/pairs/*.parquet')
    )
    where column_name in ('triplet', 'kind')
);

with

---------- imports

-- which cells the run stores: a run without the cells this file needs stops
-- here (sql/lib/cells_guard.sql)
cells_guard as (
    from cells_guard([getvariable('run')], ['all'],
                     'adjectives.sql needs every word cell',
                     'all')
),

pairs as (
    select
        pair_id,
        triplet,
        kind,
        template,
        sentence_id_a,
        sentence_id_b,
        score,
        attribution_sum,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
    where triplet is not null
),

sentences as (
    select
        sentence_id,
        words,
    from read_parquet(getvariable('run') || '/sentences/*.parquet')
),

word_cells as (
    select
        pair_id,
        u,
        v,
        value,
    from read_parquet(getvariable('run') || '/word_cells/*.parquet')
    where u = v and (select ok from cells_guard)
),

---------- logic

pair_words as (
    select
        pairs.*,
        sentences_a.words as words_a,
        sentences_b.words as words_b,
    from pairs
    inner join sentences as sentences_a
        on pairs.sentence_id_a = sentences_a.sentence_id
    inner join sentences as sentences_b
        on pairs.sentence_id_b = sentences_b.sentence_id
),

-- the 1-based positions where the two word lists differ
differences as (
    select
        *,
        case
            when len(words_a) = len(words_b) then list_filter(
                range(1, len(words_a) + 1),
                lambda k: lower(words_a[k]) <> lower(words_b[k])
            )
        end as positions,
    from pair_words
),

adjective_pairs as (
    select
        pair_id,
        triplet,
        kind,
        template,
        case when len(positions) = 1 then positions[1] - 1 end as u,
        case when len(positions) = 1 then words_a[positions[1]] end
            as word_a,
        case when len(positions) = 1 then words_b[positions[1]] end
            as word_b,
        score,
        attribution_sum,
    from differences
),

adjectives as (
    select
        adjective_pairs.pair_id,
        adjective_pairs.triplet,
        adjective_pairs.kind,
        adjective_pairs.template,
        adjective_pairs.word_a,
        adjective_pairs.word_b,
        adjective_pairs.u,
        word_cells.value as attribution,
        adjective_pairs.score,
        adjective_pairs.attribution_sum,
    from adjective_pairs
    left join word_cells
        on adjective_pairs.pair_id = word_cells.pair_id
        and adjective_pairs.u = word_cells.u
),

-- the same two adjectives in the same template and kind as a pair earlier in
-- triplet order (beautiful/pretty/ugly and ugly/hideous/beautiful share
-- their opposite pair): one sentence pair counted twice
flagged as (
    select
        *,
        word_a is not null and row_number() over (
            partition by
                template,
                kind,
                least(lower(word_a), lower(word_b)),
                greatest(lower(word_a), lower(word_b))
            order by triplet, pair_id
        ) > 1 as is_repeat,
    from adjectives
)

select * from flagged
order by triplet, template, kind;
