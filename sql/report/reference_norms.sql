-- reference_norms.sql: does the approximate-mode bound f(a, b) + 1 hold
-- for this run's model and layer?
--
-- Question  In approximate mode sum(A) converges to (cos)
--           [e(a)-e(r_a)].[e(b)-e(r_b)] / (||e(a)|| ||e(b)||), whose
--           reference term f(r_a, r_b) ||e(r_a)|| ||e(r_b)|| / (||e(a)||
--           ||e(b)||) is about 1 only when the references' embeddings
--           are no longer than the sentences'. What does sum(A) converge
--           to on average (pairs.target), against the mean score, and
--           how long are the references' embeddings?
-- Paper     Fig 5 (§4.5) and Eq. 4: sum(A) ~ f(a, b) + 1, so 2 is the
--           largest sum(A) takes, the off-the-shelf model's "score
--           maximum"; a positive sum above it is offset by negative
--           cells (the report's pos_neg_sums section uses this file to
--           say whether sum(A) stays within 2 for the run).
-- Inputs    pairs of run: score, target (what sum(A) converges to)
--           sentences of run: embedding_norm, reference_embedding (a
--           reference embedding with a null element has no norm: left out)
-- Grain     one row (the run).
-- Columns   n_pairs              pairs with a target
--           mean_score           mean f(a, b)
--           mean_target          mean of what sum(A) converges to
--           mean_target_minus_score
--           mean_embedding_norm  mean ||e(x)|| over the sentences
--           mean_reference_norm  mean ||e(r_x)|| over the sentences
--           reference_norm_ratio mean_reference_norm / mean_embedding_norm
--                                (null when either mean is 0 or null)
--           is_bound_exceeded    mean_target > max_score: the mean of
--                                what sum(A) converges to is above the
--                                bound, so the bound does not hold
-- Params    max_score  2 (the approximate-mode bound f(a, b) + 1)
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/report/reference_norms.sql
--           xsbert sql --run runs/<id> --file sql/report/reference_norms.sql

with

---------- imports

pairs as (
    select
        score,
        target,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
    where target is not null
),

sentences as (
    select
        embedding_norm,
        reference_embedding,
    from read_parquet(getvariable('run') || '/sentences/*.parquet')
),

---------- logic

pair_means as (
    select
        count(*) as n_pairs,
        avg(score) as mean_score,
        avg(target) as mean_target,
    from pairs
),

-- a reference embedding with a null element has no norm (left out)
reference_norms_per_sentence as (
    select
        embedding_norm,
        case
            when list_count(reference_embedding) = len(reference_embedding)
                then sqrt(list_inner_product(reference_embedding,
                                             reference_embedding))
        end as reference_norm,
    from sentences
),

norm_means as (
    select
        avg(embedding_norm) as mean_embedding_norm,
        avg(reference_norm) as mean_reference_norm,
    from reference_norms_per_sentence
),

reference_norms as (
    select
        pair_means.n_pairs,
        pair_means.mean_score,
        pair_means.mean_target,
        pair_means.mean_target - pair_means.mean_score
            as mean_target_minus_score,
        norm_means.mean_embedding_norm,
        norm_means.mean_reference_norm,
        norm_means.mean_reference_norm
            / nullif(norm_means.mean_embedding_norm, 0)
            as reference_norm_ratio,
        pair_means.mean_target
            > coalesce(getvariable('max_score'), 2.0) as is_bound_exceeded,
    from pair_means
    cross join norm_means
)

select * from reference_norms;
