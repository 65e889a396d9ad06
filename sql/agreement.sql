-- agreement.sql: do two runs of the same pairs attribute alike?
--
-- Question  For the same pairs attributed twice (exact vs approximate
--           mode, two layers, two quadratures, two seeds), how well do the
--           matrices agree, per pair, by the pair's score?
-- Paper     Fig 3/4 (§4.4): Exact vs Tuned (approximate), "layer eleven":
--           Spearman 0.81 +- 0.07 for s > 0.75 (the (0.75, 1.0] bin);
--           for s > 0.5 (Fig 4): Spearman 0.60 +- 0.13 (layer 10) and
--           0.40 +- 0.17 (layer 9), Pearson 0.80 +- 0.11 (layer 8),
--           top-3 Jaccard 0.88 +- 0.17 (layer 11) to 0.75 +- 0.20
--           (layer 8), top-10 Jaccard 0.83 +- 0.10 (layer 11) to
--           0.60 +- 0.14 (layer 8).
--           Content tokens and top-k by |value| are our choices: the
--           paper states neither.
-- Inputs    cells of run and run2 (level 'word': word_cells), joined on
--           (pair_id, i, j): the cells stored in both (all of them without
--           --min-abs; runs of different tokenizers do not match); by
--           default only the cells of two content tokens (special tokens
--           out: our default, the paper does not say which cells)
--           pairs of run and run2: score; only pairs in both runs with
--           the same texts (sentence ids) and the same token counts count,
--           so a pair re-tokenised differently (another tokenizer,
--           another truncation) is left out, not misaligned
--           sentences of run: word_ids (a special token has none)
--           manifest.json of run and run2: config.cells; a run of
--           --cells same-token or none is an error (it lacks the cells)
-- Per pair  spearman  Pearson correlation of the average ranks of the two
--                     runs' values (ties averaged: scipy's spearmanr)
--           pearson   Pearson correlation of the values
--           jaccard_topK  |T1 & T2| / |T1 | T2|, Tr = the K cells of
--                     largest |value| (top_by 'abs') or largest value
--                     (top_by 'value') in run r; ties broken by the smaller
--                     i, then the smaller j
--           mean score s = (score in run + score in run2) / 2
-- How       Ranks from the store where they apply: the job writes each
--           cell's average rank among its pair's cells (value_rank) and
--           among the pair's content cells (content_rank; docs/STORE.md).
--           When both runs hold every cell of every pair (store version
--           3 or later, no --min-abs) and mark the same tokens special,
--           the cells they share are all their cells, so those ranks are
--           the ranks over the matched cells: no cell is sorted here, the
--           runs' cells are only joined (one integer key per cell: pair
--           number, i, j; i and j below 32768) and aggregated. Otherwise
--           (pruned runs, older stores) each run's matched cells are
--           ranked here by one window sort per run (rank() and its peer
--           count give the average rank; the top-10 cells of a run lie
--           among its 10 smallest and 10 largest values, so only those
--           reach the top-10 aggregate): the same answer, slower. The
--           first statement decides which (agreement_stored_ranks), so
--           DuckDB plans only that branch. Cost on full QQP (404k pairs,
--           115M cells per run): bench/results/sql.md
-- Grain     one row per bin (bin_low, bin_high] of s of width bin_width
--           (right-closed: the top cos bin is (0.75, 1.0]), in score
--           order, then one row with score_bin = 'all'.
-- Columns   score_bin ('(low, high]' | 'all'), bin_low, bin_high (null
--           for 'all'), n_pairs, n_correlated, spearman_mean,
--           spearman_std, pearson_mean, pearson_std, jaccard_top3_mean,
--           jaccard_top3_std, jaccard_top10_mean, jaccard_top10_std
--           (std: sample standard deviation over the bin's pairs, null
--           for fewer than two), then the settings the row is for: level,
--           include_special (true at level 'word': words have no special
--           tokens), top_by. A pair with one matched cell, or whose values
--           are constant in either run, has no correlation (null, never
--           NaN): it counts in n_pairs and the Jaccard columns only;
--           n_correlated counts the pairs that have one, the pairs the
--           spearman and pearson columns are over (null when none)
-- Params    level            'token' (default) | 'word': the word matrices
--                            (word_cells, means over a word's tokens)
--           include_special  false (default): the cells of two content
--                            tokens; true: every cell, [CLS]/[SEP]/<s>
--                            rows and columns included
--           top_by           'abs' (default): top-K by |value|; 'value':
--                            by signed value (the most positive cells)
--           bin_width        0.25
--           pair_fraction    1.0: all pairs. Less: a deterministic subset of
--                            about that share of the pairs (by a hash of
--                            pair_id, the same in both runs), for a quicker
--                            answer on a very large run
--           use_stored_ranks true (default): the stored ranks where they
--                            apply; false: rank here always (a check: the
--                            same answer)
--           The paper's subsets: all pairs (Fig 3: the 'all' row), s > 0.5
--           (Fig 4: the bins above 0.5) and s > 0.75 (the headline: the
--           (0.75, 1.0] bin) at the default bin_width.
-- Run       duckdb -cmd "set variable run = 'runs/<exact>'" \
--                  -cmd "set variable run2 = 'runs/<approx>'" \
--                  -f sql/agreement.sql
--           xsbert sql --run runs/<exact> --run2 runs/<approx> \
--                  --file sql/agreement.sql --var include_special=true

.read sql/lib/cells_guard.sql

-- One run's inputs, written once for run and run2 (table macros, called below
-- with getvariable('run') and getvariable('run2')):
-- its token cells (level 'token') or word cells (level 'word', u and v read
-- as i and j), with their stored ranks (null in stores before version 3)
create or replace temp macro agreement_cells(run) as table
    select pair_id, i, j, value, value_rank, content_rank,
    from (
        from read_parquet(run || '/cells/*.parquet')
        union all by name
        select null::float as value_rank, null::float as content_rank,
        where false
    )
    where coalesce(getvariable('level'), 'token') = 'token'
    union all
    select pair_id, u, v, value, value_rank, null::float,
    from (
        from read_parquet(run || '/word_cells/*.parquet')
        union all by name
        select null::float as value_rank,
        where false
    )
    where getvariable('level') = 'word';

-- its pairs, with the stored top-10 cells of the level, cells and order
-- asked for (one integer per cell: i * 65536 + j)
create or replace temp macro agreement_pairs(run) as table
    select
        pair_id,
        score,
        sentence_id_a,
        sentence_id_b,
        n_tokens_a,
        n_tokens_b,
        case when getvariable('level') = 'word'
            then [(c.u * 65536 + c.v)::uinteger for c in
                  case when getvariable('top_by') = 'value' then word_top10_value
                       else word_top10_abs end]
            else [(c.i * 65536 + c.j)::uinteger for c in
                  case when getvariable('top_by') = 'value'
                       then case when getvariable('include_special')::boolean
                                 then top10_value else content_top10_value end
                       else case when getvariable('include_special')::boolean
                                 then top10_abs else content_top10_abs end end]
        end as stored_top10,
    from (
        from read_parquet(run || '/pairs/*.parquet')
        union all by name
        select
            null::struct(i integer, j integer)[] as top10_abs,
            null::struct(i integer, j integer)[] as top10_value,
            null::struct(i integer, j integer)[] as content_top10_abs,
            null::struct(i integer, j integer)[] as content_top10_value,
            null::struct(u integer, v integer)[] as word_top10_abs,
            null::struct(u integer, v integer)[] as word_top10_value,
        where false
    );

-- its sentences: the 0-based positions of the special tokens (no word id)
create or replace temp macro agreement_special(run) as table
    select
        sentence_id,
        [k - 1 for w, k in word_ids if w is null] as special,
    from read_parquet(run || '/sentences/*.parquet');

-- one integer per cell of a compared pair: pair_no * 2^32 + i * 65536 + j
create or replace temp macro agreement_key(pair_no, i, j) as
    pair_no::bigint * 4294967296 + i * 65536 + j;

-- the rank the job stored among the cells compared: every cell's
-- (include_special, or level 'word') or the content cells' (null for a
-- special token's cell)
create or replace temp macro agreement_stored_rank(value_rank, content_rank) as
    case when coalesce(getvariable('include_special'), false)::boolean
              or getvariable('level') = 'word'
         then value_rank else content_rank end;

-- Which ranks: the stored ones (true) or ranked here (false)
set variable agreement_stored_ranks = (
    with
    manifests as (
        select
            json_extract(content, '$.config.store_version')::integer
                as store_version,
            json_extract(content, '$.config.min_abs')::double as min_abs,
        from read_text([getvariable('run') || '/manifest.json',
                        getvariable('run2') || '/manifest.json'])
    ),
    special_1 as (from agreement_special(getvariable('run'))),
    special_2 as (from agreement_special(getvariable('run2')))
    select
        coalesce(getvariable('use_stored_ranks'), true)::boolean
        -- every cell of every pair, ranked by the job
        and (select bool_and(coalesce(store_version, 1) >= 3
                             and coalesce(min_abs, 0) = 0)
             from manifests)
        -- content cells: the same special tokens in both runs
        and (coalesce(getvariable('include_special'), false)::boolean
             or getvariable('level') = 'word'
             or not exists (
                 select 1
                 from special_1
                 inner join special_2
                     on special_1.sentence_id = special_2.sentence_id
                 where special_1.special <> special_2.special
             ))
);

with

---------- imports

-- which cells the runs store: runs without the cells this file needs stop
-- here (sql/lib/cells_guard.sql)
-- (checked on pairs_1, read whatever the level)
cells_guard as (
    from cells_guard([getvariable('run'), getvariable('run2')], ['all'],
                     'agreement.sql needs every cell of both runs',
                     'all')
),

-- each run's cells and pairs (the macros above)
cells_1 as not materialized (from agreement_cells(getvariable('run'))),

cells_2 as not materialized (from agreement_cells(getvariable('run2'))),

pairs_1 as (
    from agreement_pairs(getvariable('run'))
    where (select ok from cells_guard)
),

pairs_2 as (from agreement_pairs(getvariable('run2'))),

sentences_1 as (from agreement_special(getvariable('run'))),

---------- settings

settings as (
    select
        case when coalesce(getvariable('level'), 'token') in ('token', 'word')
            then coalesce(getvariable('level'), 'token')
            else error('level: ''token'' or ''word''') end as level,
        -- special tokens take part only when asked for; at level 'word'
        -- there are none
        coalesce(getvariable('include_special'), false)::boolean
            or coalesce(getvariable('level'), 'token') = 'word'
            as include_special,
        case when coalesce(getvariable('top_by'), 'abs') in ('abs', 'value')
            then coalesce(getvariable('top_by'), 'abs')
            else error('top_by: ''abs'' or ''value''') end as top_by,
        coalesce(getvariable('bin_width'), 0.25)::double as bin_width,
        coalesce(getvariable('pair_fraction'), 1.0)::double as pair_fraction,
),

---------- logic: per pair

-- the pairs compared (pair_fraction: a subset by a hash of pair_id), each
-- with a number that stands for its pair_id from here on, and the special
-- tokens' positions on each side (none when include_special)
pair_scores as (
    select
        (row_number() over ())::integer as pair_no,
        pairs_1.pair_id,
        (pairs_1.score + pairs_2.score) / 2 as mean_score,
        pairs_1.stored_top10 as stored_top10_1,
        pairs_2.stored_top10 as stored_top10_2,
        case when settings.include_special then [] else sentences_a.special end
            as special_a,
        case when settings.include_special then [] else sentences_b.special end
            as special_b,
    from pairs_1
    inner join pairs_2
        on pairs_1.pair_id = pairs_2.pair_id
        and pairs_1.sentence_id_a = pairs_2.sentence_id_a
        and pairs_1.sentence_id_b = pairs_2.sentence_id_b
        and pairs_1.n_tokens_a = pairs_2.n_tokens_a
        and pairs_1.n_tokens_b = pairs_2.n_tokens_b
    left join sentences_1 as sentences_a
        on pairs_1.sentence_id_a = sentences_a.sentence_id
    left join sentences_1 as sentences_b
        on pairs_1.sentence_id_b = sentences_b.sentence_id
    cross join settings
    where hash(pairs_1.pair_id) % 10000 < settings.pair_fraction * 10000
),

-- Ranked here (agreement_stored_ranks false): the matched cells of each
-- pair, then ranked per pair and run.
-- key: one integer per cell (agreement_key)
keyed_cells_1 as (
    select
        agreement_key(pair_scores.pair_no, cells_1.i, cells_1.j) as key,
        cells_1.value,
    from cells_1
    inner join pair_scores on cells_1.pair_id = pair_scores.pair_id
    where not getvariable('agreement_stored_ranks')
        and not (list_contains(pair_scores.special_a, cells_1.i)
                 or list_contains(pair_scores.special_b, cells_1.j))
),

keyed_cells_2 as (
    select
        agreement_key(pair_scores.pair_no, cells_2.i, cells_2.j) as key,
        cells_2.value,
    from cells_2
    inner join pair_scores on cells_2.pair_id = pair_scores.pair_id
    where not getvariable('agreement_stored_ranks')
        and not (list_contains(pair_scores.special_a, cells_2.i)
                 or list_contains(pair_scores.special_b, cells_2.j))
),

-- the cells stored in both runs; cell = i * 65536 + j
matched_cells as (
    select
        (keyed_cells_1.key // 4294967296)::integer as pair_no,
        (keyed_cells_1.key % 4294967296)::uinteger as cell,
        keyed_cells_1.value as value_1,
        keyed_cells_2.value as value_2,
    from keyed_cells_1
    inner join keyed_cells_2 on keyed_cells_1.key = keyed_cells_2.key
),

-- Ranks per pair: one window sort per run, each keeping only what the
-- aggregates below need (every matched cell passes through both sorts).
-- low and high: the first and last position of the cell's value among the
-- pair's values in the run (ascending; tied values share them): low =
-- rank(), high = low + ties - 1, and rank2_r = low + high is twice the
-- average rank. top_r: the cell can be among the 10 of largest |value_r|.
-- A cell with k larger |value| has at most k values above it (value >= 0)
-- or below it (value < 0), so the top 10 lie among the cells with
-- low <= 10 or high > n - 10 (n: the pair's matched cells)
ranked_1 as (
    select
        pair_no,
        cell,
        value_1,
        value_2,
        (2 * rank() over by_value_1 + count(*) over by_value_1_ties - 1)
            ::integer as rank2_1,
        rank() over by_value_1 <= 10
            or rank() over by_value_1 + count(*) over by_value_1_ties - 1
                > count(*) over by_value_1_all - 10
            as top_1,
    from matched_cells
    window
        by_value_1 as (partition by pair_no order by value_1),
        by_value_1_ties as (by_value_1 range between current row
                                             and current row),
        by_value_1_all as (by_value_1 rows between unbounded preceding
                                           and unbounded following)
),

ranked_cells as (
    select
        pair_no,
        cell,
        value_1,
        value_2,
        rank2_1,
        top_1,
        (2 * rank() over by_value_2 + count(*) over by_value_2_ties - 1)
            ::integer as rank2_2,
        rank() over by_value_2 <= 10
            or rank() over by_value_2 + count(*) over by_value_2_ties - 1
                > count(*) over by_value_2_all - 10
            as top_2,
    from ranked_1
    window
        by_value_2 as (partition by pair_no order by value_2),
        by_value_2_ties as (by_value_2 range between current row
                                             and current row),
        by_value_2_all as (by_value_2 rows between unbounded preceding
                                           and unbounded following)
),

-- spearman: the correlation of twice the average ranks is that of the
-- ranks. corr() is NaN, not null, when a pair has one matched cell or a
-- run's values are constant: nullif makes that null (no correlation),
-- which count(), avg() and stddev_samp() below skip.
-- top10_r: the cells of the 10 largest keys, largest first: |value_r|
-- (top_by 'abs') or value_r (top_by 'value'), ties by the smaller cell;
-- max_by keeps the 10 largest (key, -cell), a bounded top-k aggregate,
-- offered only the candidates top_r (they hold the 10 largest values too)
sorted_agreement as (
    select
        pair_no,
        nullif(corr(rank2_1, rank2_2), 'nan'::double) as spearman,
        nullif(corr(value_1, value_2), 'nan'::double) as pearson,
        max_by(cell, (case when settings.top_by = 'value' then value_1
                           else abs(value_1) end, -cell::bigint), 10)
            filter (where top_1)
            as top10_1,
        max_by(cell, (case when settings.top_by = 'value' then value_2
                           else abs(value_2) end, -cell::bigint), 10)
            filter (where top_2)
            as top10_2,
    from ranked_cells
    cross join settings
    group by pair_no
),

-- Stored ranks (agreement_stored_ranks true): each run's cells with the
-- rank the job stored among the cells compared (content cells: null for
-- a special token's cell), keyed as above, joined, aggregated as above.
-- The settings are read as getvariable() constants here (agreement_stored_rank;
-- settings checks them), so DuckDB folds them instead of joining every cell
-- to settings
stored_cells_1 as (
    select
        agreement_key(pair_scores.pair_no, cells_1.i, cells_1.j) as key,
        cells_1.value,
        agreement_stored_rank(cells_1.value_rank, cells_1.content_rank)
            as stored_rank,
    from cells_1
    inner join pair_scores on cells_1.pair_id = pair_scores.pair_id
    where getvariable('agreement_stored_ranks') and stored_rank is not null
),

stored_cells_2 as (
    select
        agreement_key(pair_scores.pair_no, cells_2.i, cells_2.j) as key,
        cells_2.value,
        agreement_stored_rank(cells_2.value_rank, cells_2.content_rank)
            as stored_rank,
    from cells_2
    inner join pair_scores on cells_2.pair_id = pair_scores.pair_id
    where getvariable('agreement_stored_ranks') and stored_rank is not null
),

stored_agreement as (
    select
        (stored_cells_1.key // 4294967296)::integer as pair_no,
        nullif(corr(stored_cells_1.stored_rank, stored_cells_2.stored_rank),
               'nan'::double) as spearman,
        nullif(corr(stored_cells_1.value, stored_cells_2.value), 'nan'::double)
            as pearson,
        null::uinteger[] as top10_1,
        null::uinteger[] as top10_2,
    from stored_cells_1
    inner join stored_cells_2 on stored_cells_1.key = stored_cells_2.key
    group by pair_no
),

pair_agreement as (
    from sorted_agreement
    union all
    from stored_agreement
),

pair_metrics as (
    select
        pair_scores.pair_id,
        pair_scores.mean_score,
        pair_agreement.spearman,
        pair_agreement.pearson,
        case when getvariable('agreement_stored_ranks')
            then pair_scores.stored_top10_1 else pair_agreement.top10_1 end
            as top_1,
        case when getvariable('agreement_stored_ranks')
            then pair_scores.stored_top10_2 else pair_agreement.top10_2 end
            as top_2,
        len(list_intersect(top_1[1:3], top_2[1:3]))
            / len(list_distinct(top_1[1:3] || top_2[1:3]))
            as jaccard_top3,
        len(list_intersect(top_1, top_2)) / len(list_distinct(top_1 || top_2))
            as jaccard_top10,
    from pair_agreement
    inner join pair_scores on pair_agreement.pair_no = pair_scores.pair_no
),

---------- logic: by score bin

binned as (
    select
        pair_metrics.*,
        -- + 0.0 turns the -0.0 of ceil(-0.4) into 0.0
        ceil(mean_score / settings.bin_width) * settings.bin_width + 0.0
            as bin_high,
        bin_high - settings.bin_width as bin_low,
    from pair_metrics
    cross join settings
),

by_bin as (
    select
        bin_low,
        bin_high,
        grouping(bin_low) = 1 as is_all,
        count(*) as n_pairs,
        count(spearman) as n_correlated,
        avg(spearman) as spearman_mean,
        stddev_samp(spearman) as spearman_std,
        avg(pearson) as pearson_mean,
        stddev_samp(pearson) as pearson_std,
        avg(jaccard_top3) as jaccard_top3_mean,
        stddev_samp(jaccard_top3) as jaccard_top3_std,
        avg(jaccard_top10) as jaccard_top10_mean,
        stddev_samp(jaccard_top10) as jaccard_top10_std,
    from binned
    group by grouping sets ((bin_low, bin_high), ())
),

agreement as (
    select
        case
            when is_all then 'all'
            else '(' || round(bin_low, 6) || ', ' || round(bin_high, 6) || ']'
        end as score_bin,
        by_bin.* exclude (is_all),
        settings.level,
        settings.include_special,
        settings.top_by,
        is_all,
    from by_bin
    cross join settings
)

select * exclude (is_all) from agreement
order by is_all, bin_low;
