-- tests/sql_reference/agreement_windows.sql: the reference for sql/agreement.sql
--
-- sql/agreement.sql as it was before store version 3 (window functions over every
-- matched cell, string pair ids), kept unchanged below this note as the
-- reference that tests/test_sql.py compares the current file with: the
-- same answers on the same runs, ties, degenerate pairs and pruned cells
-- included. It is slow on a full-QQP store (bench/results/sql.md) and is
-- not an analysis: do not run it from sql/.
--
-- agreement.sql: do two runs of the same pairs attribute alike?
--
-- Question  For the same pairs attributed twice (exact vs approximate
--           mode, two layers, two quadratures), how well do the token
--           matrices agree, per pair, by the pair's score?
-- Paper     Fig 3/4: exact vs approximate at layer 11: Spearman
--           0.81 +- 0.07 for s > 0.75 (the (0.75, 1.0] bin); top-10
--           Jaccard 0.83 (layer 11) to 0.60 (layer 8).
-- Inputs    cells of run and run2, joined on (pair_id, i, j): the cells
--           stored in both (all of them without --min-abs; runs of
--           different tokenizers do not match)
--           pairs of run and run2: score; only pairs in both runs with
--           the same texts (sentence ids) and the same token counts on
--           both sides count, so a pair re-tokenised differently (another
--           tokenizer, another truncation) is left out, not misaligned
-- Per pair  spearman  Pearson correlation of the average ranks of the
--                     two runs' values (ties averaged: scipy's spearmanr)
--           pearson   Pearson correlation of the values
--           jaccard_topK  |T1 & T2| / |T1 | T2|, Tr = the K cells of
--                     largest |value| in run r; ties in |value| are
--                     broken by the smaller i, then the smaller j
--           mean score s = (score in run + score in run2) / 2
-- Grain     one row per bin (bin_low, bin_high] of s of width bin_width
--           (right-closed: the top cos bin is (0.75, 1.0]), in score
--           order, then one row with score_bin = 'all'.
-- Columns   score_bin ('(low, high]' | 'all'), bin_low, bin_high (null
--           for 'all'), n_pairs, n_correlated, spearman_mean,
--           spearman_std, pearson_mean, pearson_std, jaccard_top3_mean,
--           jaccard_top3_std, jaccard_top10_mean, jaccard_top10_std
--           (std: sample standard deviation over the bin's pairs, null
--           for fewer than two). A pair with one matched cell, or whose
--           values are constant in either run, has no correlation (null,
--           never NaN): it counts in n_pairs and the Jaccard columns
--           only; n_correlated counts the pairs that have one, the pairs
--           the spearman and pearson columns are over (null when none)
-- Params    bin_width      0.25
--           pair_fraction  1.0: all pairs. Less: a deterministic subset of
--                          about that share of the pairs (by a hash of
--                          pair_id, the same in both runs), for a quicker
--                          answer on a very large run
-- Run       duckdb -cmd "set variable run = 'runs/<exact>'" \
--                  -cmd "set variable run2 = 'runs/<approx>'" \
--                  -f sql/agreement.sql
--           xsbert sql --run runs/<exact> --run2 runs/<approx> \
--                  --file sql/agreement.sql --var bin_width=0.1

with

---------- imports

cells_1 as (
    select
        pair_id,
        i,
        j,
        value,
    from read_parquet(getvariable('run') || '/cells/*.parquet')
    where hash(pair_id) % 10000
        < coalesce(getvariable('pair_fraction'), 1.0) * 10000
),

cells_2 as (
    select
        pair_id,
        i,
        j,
        value,
    from read_parquet(getvariable('run2') || '/cells/*.parquet')
    where hash(pair_id) % 10000
        < coalesce(getvariable('pair_fraction'), 1.0) * 10000
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

---------- logic: per pair

matched_cells as (
    select
        c1.pair_id,
        c1.i,
        c1.j,
        c1.value as value_1,
        c2.value as value_2,
    from cells_1 as c1
    inner join cells_2 as c2
        on c1.pair_id = c2.pair_id
        and c1.i = c2.i
        and c1.j = c2.j
),

-- average rank = rank() + (number of tied rows - 1) / 2
ranked_cells as (
    select
        pair_id,
        i::bigint * 65536 + j as cell,
        value_1,
        value_2,
        rank() over by_value_1
            + (count(*) over (by_value_1 range between current row
                                             and current row) - 1) / 2
            as rank_1,
        rank() over by_value_2
            + (count(*) over (by_value_2 range between current row
                                             and current row) - 1) / 2
            as rank_2,
    from matched_cells
    window
        by_value_1 as (partition by pair_id order by value_1),
        by_value_2 as (partition by pair_id order by value_2)
),

-- corr() is NaN, not null, when a pair has one matched cell or a run's
-- values are constant: nullif makes that null (no correlation), which
-- count(), avg() and stddev_samp() below skip.
-- top10_r: the cells (cell = i * 65536 + j) of the 10 largest |value_r|,
-- largest first: max_by keeps the 10 largest keys (|value_r|, -cell), a
-- bounded top-k aggregate
pair_agreement as (
    select
        pair_id,
        nullif(corr(rank_1, rank_2), 'nan'::double) as spearman,
        nullif(corr(value_1, value_2), 'nan'::double) as pearson,
        max_by(cell, (abs(value_1), -cell), 10) as top10_1,
        max_by(cell, (abs(value_2), -cell), 10) as top10_2,
    from ranked_cells
    group by 1
),

pair_scores as (
    select
        pairs_1.pair_id,
        (pairs_1.score + pairs_2.score) / 2 as mean_score,
    from pairs_1
    inner join pairs_2
        on pairs_1.pair_id = pairs_2.pair_id
        and pairs_1.sentence_id_a = pairs_2.sentence_id_a
        and pairs_1.sentence_id_b = pairs_2.sentence_id_b
        and pairs_1.n_tokens_a = pairs_2.n_tokens_a
        and pairs_1.n_tokens_b = pairs_2.n_tokens_b
),

pair_metrics as (
    select
        pair_agreement.pair_id,
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
    inner join pair_scores on pair_agreement.pair_id = pair_scores.pair_id
),

---------- logic: by score bin

binned as (
    select
        pair_metrics.*,
        -- + 0.0 turns the -0.0 of ceil(-0.4) into 0.0
        ceil(mean_score / bin_width) * bin_width + 0.0 as bin_high,
        bin_high - bin_width as bin_low,
    from pair_metrics
    cross join (
        select coalesce(getvariable('bin_width'), 0.25)::double as bin_width
    )
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
        * exclude (is_all),
        is_all,
    from by_bin
)

select * exclude (is_all) from agreement
order by is_all, bin_low;
