-- agreement.sql: do two runs of the same pairs attribute alike?
--
-- Question  For the same pairs attributed twice (exact vs approximate
--           mode, two layers, two quadratures), how well do the token
--           matrices agree, per pair, by the pair's score?
-- Paper     Fig 3/4: exact vs approximate at layer 11: Spearman
--           0.81 +- 0.07 for s > 0.75 (the (0.75, 1.0] bin); for
--           s > 0.5: top-3 Jaccard 0.88 (layer 11), top-10 Jaccard 0.83
--           (layer 11) to 0.60 (layer 8).
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
-- How       pairs are numbered once (the pairs both runs hold alike); a
--           cell is one integer key (pair number, i, j; i and j below
--           65536), the runs' cells are joined on it, then ranked per
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
),

cells_2 as (
    select
        pair_id,
        i,
        j,
        value,
    from read_parquet(getvariable('run2') || '/cells/*.parquet')
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

-- the pairs compared (pair_fraction: a subset by a hash of pair_id), each
-- with a number that stands for its pair_id from here on
pair_scores as (
    select
        (row_number() over ())::integer as pair_no,
        pairs_1.pair_id,
        (pairs_1.score + pairs_2.score) / 2 as mean_score,
    from pairs_1
    inner join pairs_2
        on pairs_1.pair_id = pairs_2.pair_id
        and pairs_1.sentence_id_a = pairs_2.sentence_id_a
        and pairs_1.sentence_id_b = pairs_2.sentence_id_b
        and pairs_1.n_tokens_a = pairs_2.n_tokens_a
        and pairs_1.n_tokens_b = pairs_2.n_tokens_b
    where hash(pairs_1.pair_id) % 10000
        < coalesce(getvariable('pair_fraction'), 1.0) * 10000
),

-- key = pair_no * 2^32 + i * 65536 + j: one integer per cell
keyed_cells_1 as (
    select
        pair_scores.pair_no::bigint * 4294967296 + cells_1.i * 65536 + cells_1.j
            as key,
        cells_1.value,
    from cells_1
    inner join pair_scores on cells_1.pair_id = pair_scores.pair_id
),

keyed_cells_2 as (
    select
        pair_scores.pair_no::bigint * 4294967296 + cells_2.i * 65536 + cells_2.j
            as key,
        cells_2.value,
    from cells_2
    inner join pair_scores on cells_2.pair_id = pair_scores.pair_id
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
-- top10_r: the cells of the 10 largest |value_r|, largest first: max_by
-- keeps the 10 largest keys (|value_r|, -cell), a bounded top-k
-- aggregate, offered only the candidates top_r
pair_agreement as (
    select
        pair_no,
        nullif(corr(rank2_1, rank2_2), 'nan'::double) as spearman,
        nullif(corr(value_1, value_2), 'nan'::double) as pearson,
        max_by(cell, (abs(value_1), -cell::bigint), 10) filter (where top_1)
            as top10_1,
        max_by(cell, (abs(value_2), -cell::bigint), 10) filter (where top_2)
            as top10_2,
    from ranked_cells
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
