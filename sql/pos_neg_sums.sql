-- pos_neg_sums.sql: how large are the positive and negative parts of the
-- attributions, compared with the largest possible score?
--
-- Question  sum(A) = positive_sum + negative_sum. How often does the
--           positive part alone exceed the largest value sum(A) can
--           take (max_score): 1 in exact mode (sum(A) -> f(a,b) <= 1),
--           2 in approximate mode (sum(A) ~ f(a,b) + 1, paper Eq. 4;
--           exactly f(a,b) - f(a,r_b) - f(b,r_a) + f(r_a,r_b), Eq. 2's
--           left-hand side)? Large positive and negative
--           parts that cancel make single cells hard to read.
-- Paper     Fig 5: positive / negative attribution sums.
-- Inputs    pairs of run: score, attribution_sum, positive_sum,
--           negative_sum
--           manifest.json of run: config.mode, config.similarity
-- Grain     one row per score bin (bin_low, bin_high] of width bin_width
--           (right-closed, so the top bin of cos scores is (0.75, 1.0]),
--           in score order, then one row with score_bin = 'all'.
-- Columns   score_bin ('(low, high]' | 'all'), bin_low, bin_high
--             (null for 'all'), n_pairs,
--           mean_score, mean_attribution_sum, mean_positive_sum,
--           mean_negative_sum, max_positive_sum, min_negative_sum,
--           n_positive_exceeds      pairs with positive_sum > max_score
--           share_positive_exceeds  n_positive_exceeds / n_pairs
--           max_score, mode, similarity
-- Params    max_score  from the manifest: 1 (exact) or 2 (approx) for cos
--                      scores; null (no share) for dot unless set
--           bin_width  0.25
--           pairs_of   a run directory: only the pairs that run holds too
--                      (Fig 5 of two runs on the same pairs); unset: all
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/pos_neg_sums.sql
--           xsbert sql --run runs/<id> --file sql/pos_neg_sums.sql --var max_score=1.5

with

---------- imports

pairs as (
    select
        score,
        attribution_sum,
        positive_sum,
        negative_sum,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
    where getvariable('pairs_of') is null or pair_id in (
        select pair_id
        from read_parquet(coalesce(getvariable('pairs_of'), getvariable('run')) || '/pairs/*.parquet')
    )
),

manifest as (
    select
        json_extract_string(content, '$.config.mode') as mode,
        json_extract_string(content, '$.config.similarity') as similarity,
    from read_text(getvariable('run') || '/manifest.json')
),

---------- logic

parameters as (
    select
        mode,
        similarity,
        coalesce(
            getvariable('max_score')::double,
            case
                when similarity not in ('cos', 'cosine') then null
                when mode = 'exact' then 1.0
                else 2.0
            end
        ) as max_score,
        coalesce(getvariable('bin_width'), 0.25)::double as bin_width,
    from manifest
),

binned as (
    select
        pairs.*,
        parameters.max_score,
        -- + 0.0 turns the -0.0 of ceil(-0.4) into 0.0
        ceil(pairs.score / parameters.bin_width) * parameters.bin_width + 0.0
            as bin_high,
        bin_high - parameters.bin_width as bin_low,
    from pairs
    cross join parameters
),

by_bin as (
    select
        bin_low,
        bin_high,
        grouping(bin_low) = 1 as is_all,
        count(*) as n_pairs,
        avg(score) as mean_score,
        avg(attribution_sum) as mean_attribution_sum,
        avg(positive_sum) as mean_positive_sum,
        avg(negative_sum) as mean_negative_sum,
        max(positive_sum) as max_positive_sum,
        min(negative_sum) as min_negative_sum,
        count(*) filter (where positive_sum > max_score)
            as n_positive_exceeds,
        n_positive_exceeds / count(*) as share_positive_exceeds,
        any_value(max_score) as max_score,
    from binned
    group by grouping sets ((bin_low, bin_high), ())
),

summary as (
    select
        case
            when is_all then 'all'
            else '(' || round(bin_low, 6) || ', ' || round(bin_high, 6) || ']'
        end as score_bin,
        bin_low,
        bin_high,
        n_pairs,
        mean_score,
        mean_attribution_sum,
        mean_positive_sum,
        mean_negative_sum,
        max_positive_sum,
        min_negative_sum,
        case when max_score is not null then n_positive_exceeds end
            as n_positive_exceeds,
        case when max_score is not null then share_positive_exceeds end
            as share_positive_exceeds,
        is_all,
        max_score,
    from by_bin
)

select
    summary.* exclude (is_all),
    parameters.mode,
    parameters.similarity,
from summary
cross join parameters
order by summary.is_all, summary.bin_low;
