-- reference_terms.sql: how far are the reference terms of the
-- approximate attributions from zero?
--
-- Question  In approximate mode sum(A) converges to f(a,b) - f(a,r_b)
--           - f(b,r_a) + f(r_a,r_b) (cos; docs/DESIGN.md §1). How are
--           the reference similarities f(a,r_b), f(b,r_a) and the
--           reference term f(r_a,r_b) distributed?
-- Paper     Fig 2 (§4.3): 85.8% of reference similarities within +-0.1 of
--           0; 6.7% of reference terms below 0.9 (all-mpnet-base-v2 shelf;
--           forward quantities of the whole model: no layer).
-- Inputs    pairs of run: ref_sim_a = f(a,r_b), ref_sim_b = f(b,r_a),
--           ref_term = f(r_a,r_b). In exact mode e(r) = 0 and all three
--           are 0 by definition: the analysis is for approximate runs.
-- Grain     one row per quantity, in this order:
--             ref_sim_a  f(a, r_b)
--             ref_sim_b  f(b, r_a)
--             ref_sim    both reference similarities pooled (2 per pair):
--                        the paper's 85.8% is this row's share_near_zero
--             ref_term   f(r_a, r_b): the paper's 6.7% is this row's
--                        share_below_threshold
-- Columns   quantity, n, mean, std, min, q05, q25, median, q75, q95, max
--             (quantiles: quantile_cont, linear interpolation)
--           near_zero, share_near_zero   share with |value| <= near_zero
--           term_threshold, share_below_threshold
--                                        share with value < term_threshold
--             (both shares are given on every row; each row's reading is
--             the one named above)
-- Params    near_zero       0.1
--           term_threshold  0.9
--           pairs_of        a run directory: only the pairs that run holds
--                           too (two runs on the same pairs); unset: all
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/reference_terms.sql
--           xsbert sql --run runs/<id> --file sql/reference_terms.sql

with

---------- imports

pairs as (
    select
        ref_sim_a,
        ref_sim_b,
        ref_term,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
    where getvariable('pairs_of') is null or pair_id in (
        select pair_id
        from read_parquet(coalesce(getvariable('pairs_of'), getvariable('run')) || '/pairs/*.parquet')
    )
),

---------- logic

quantities as (
    select 1 as ord, 'ref_sim_a' as quantity, ref_sim_a as value from pairs
    union all
    select 2, 'ref_sim_b', ref_sim_b from pairs
    union all
    select 3, 'ref_sim', ref_sim_a from pairs
    union all
    select 3, 'ref_sim', ref_sim_b from pairs
    union all
    select 4, 'ref_term', ref_term from pairs
),

parameters as (
    select
        coalesce(getvariable('near_zero'), 0.1)::double as near_zero,
        coalesce(getvariable('term_threshold'), 0.9)::double
            as term_threshold,
),

summary as (
    select
        quantities.ord,
        quantities.quantity,
        count(quantities.value) as n,
        avg(quantities.value) as mean,
        stddev_samp(quantities.value) as std,
        min(quantities.value) as min,
        quantile_cont(quantities.value, 0.05) as q05,
        quantile_cont(quantities.value, 0.25) as q25,
        quantile_cont(quantities.value, 0.5) as median,
        quantile_cont(quantities.value, 0.75) as q75,
        quantile_cont(quantities.value, 0.95) as q95,
        max(quantities.value) as max,
        any_value(parameters.near_zero) as near_zero,
        avg((abs(quantities.value) <= parameters.near_zero)::double)
            as share_near_zero,
        any_value(parameters.term_threshold) as term_threshold,
        avg((quantities.value < parameters.term_threshold)::double)
            as share_below_threshold,
    from quantities
    cross join parameters
    group by 1, 2
)

select * exclude (ord) from summary
order by ord;
