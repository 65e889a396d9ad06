-- agreement.sql: do two runs of the same pairs attribute alike?
--
-- Question  For the same pairs attributed twice (exact vs approximate
--           mode, two layers, two quadratures, two seeds), how well do the
--           matrices agree, per pair, by the pair's score?
-- Paper     Fig 3/4: exact vs approximate, content tokens, layer 11:
--           Spearman 0.81 +- 0.07 for s > 0.75 (the (0.75, 1.0] bin);
--           for s > 0.5: top-3 Jaccard 0.88 (layer 11), top-10 Jaccard
--           0.83 (layer 11) to 0.60 (layer 8).
-- Inputs    cells of run and run2 (level 'word': word_cells), joined on
--           (pair_id, i, j): the cells stored in both (all of them without
--           --min-abs; runs of different tokenizers do not match); by
--           default only the cells of two content tokens (special tokens
--           out, as the paper compares them)
--           pairs of run and run2: score; only pairs in both runs with
--           the same texts (sentence ids) and the same token counts count,
--           so a pair re-tokenised differently (another tokenizer,
--           another truncation) is left out, not misaligned
--           sentences of run: word_ids (a special token has none)
-- Per pair  spearman  Pearson correlation of the average ranks of the two
--                     runs' values (ties averaged: scipy's spearmanr)
--           pearson   Pearson correlation of the values
--           jaccard_topK  |T1 & T2| / |T1 | T2|, Tr = the K cells of
--                     largest |value| (top_by 'abs') or largest value
--                     (top_by 'value') in run r; ties broken by the smaller
--                     i, then the smaller j
--           mean score s = (score in run + score in run2) / 2
-- How       pairs are numbered once (the pairs both runs hold alike); a
--           cell is one integer key (pair number, i, j; i and j below
--           32768), the runs' cells are joined on it, then ranked per
--           pair by one window sort per run (rank() and its peer count
--           give the average rank); the top-10 cells of a run lie among
--           its 10 smallest and 10 largest values, so only those reach
--           the top-10 aggregate. Cost on full QQP (404k pairs, 115M
--           cells per run): bench/results/sql.md
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
--           The paper's subsets: all pairs (Fig 3: the 'all' row), s > 0.5
--           (Fig 4: the bins above 0.5) and s > 0.75 (the headline: the
--           (0.75, 1.0] bin) at the default bin_width.
-- Run       duckdb -cmd "set variable run = 'runs/<exact>'" \
--                  -cmd "set variable run2 = 'runs/<approx>'" \
--                  -f sql/agreement.sql
--           xsbert sql --run runs/<exact> --run2 runs/<approx> \
--                  --file sql/agreement.sql --var include_special=true

with

---------- imports

-- level 'token': the token cells; 'word': the word cells (u, v as i, j)
cells_1 as (
    select pair_id, i, j, value,
    from read_parquet(getvariable('run') || '/cells/*.parquet')
    where coalesce(getvariable('level'), 'token') = 'token'
    union all
    select pair_id, u, v, value,
    from read_parquet(getvariable('run') || '/word_cells/*.parquet')
    where getvariable('level') = 'word'
),

cells_2 as (
    select pair_id, i, j, value,
    from read_parquet(getvariable('run2') || '/cells/*.parquet')
    where coalesce(getvariable('level'), 'token') = 'token'
    union all
    select pair_id, u, v, value,
    from read_parquet(getvariable('run2') || '/word_cells/*.parquet')
    where getvariable('level') = 'word'
),

pairs_1 as (
    select
        pair_id,
        score,
        sentence_id_a,
        sentence_id_b,
        n_tokens_a,
        n_tokens_b,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
),

pairs_2 as (
    select
        pair_id,
        score,
        sentence_id_a,
        sentence_id_b,
        n_tokens_a,
        n_tokens_b,
    from read_parquet(getvariable('run2') || '/pairs/*.parquet')
),

sentences_1 as (
    select
        sentence_id,
        -- 0-based positions of the special tokens (no word id)
        [k - 1 for w, k in word_ids if w is null] as special,
    from read_parquet(getvariable('run') || '/sentences/*.parquet')
),

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

-- key = pair_no * 2^32 + i * 65536 + j: one integer per cell
keyed_cells_1 as (
    select
        pair_scores.pair_no::bigint * 4294967296 + cells_1.i * 65536 + cells_1.j
            as key,
        cells_1.value,
    from cells_1
    inner join pair_scores on cells_1.pair_id = pair_scores.pair_id
    where not (list_contains(pair_scores.special_a, cells_1.i)
               or list_contains(pair_scores.special_b, cells_1.j))
),

keyed_cells_2 as (
    select
        pair_scores.pair_no::bigint * 4294967296 + cells_2.i * 65536 + cells_2.j
            as key,
        cells_2.value,
    from cells_2
    inner join pair_scores on cells_2.pair_id = pair_scores.pair_id
    where not (list_contains(pair_scores.special_a, cells_2.i)
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
pair_agreement as (
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

pair_metrics as (
    select
        pair_scores.pair_id,
        pair_scores.mean_score,
        pair_agreement.spearman,
        pair_agreement.pearson,
        len(list_intersect(top10_1[1:3], top10_2[1:3]))
            / len(list_distinct(top10_1[1:3] || top10_2[1:3]))
            as jaccard_top3,
        len(list_intersect(top10_1, top10_2))
            / len(list_distinct(top10_1 || top10_2))
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
