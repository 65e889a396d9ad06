-- table1.sql: how well do the run's scores rank the gold labels?
--
-- Question  Spearman correlation (x 100) of the predicted similarity
--           f(a, b) (pairs.score) with the gold label, as in the paper's
--           Table 1 (STS-B test; one row per model there, one per run here).
-- Paper     Table 1: Shelf 83.4, Tuned 87.8, Exact 87.5, Orig 86.0
--           (all-mpnet-base-v2, STS-B test, every model scored with
--           cosine, Orig included: paper §4.2; jobs/paper.py).
-- Inputs    pairs of run: score, label (pairs without a label are left out)
--           manifest.json of run: model, mode, similarity, layer
-- Grain     one row (the run).
-- Columns   model, mode, similarity, layer   from the run's config
--           n_pairs        pairs with a label and a score
--           spearman_x100  100 * spearman
--           spearman       Pearson correlation of the average ranks of
--                          score and label (ties get the average rank:
--                          scipy.stats.spearmanr)
--           pearson        Pearson correlation of score and label
--           (spearman_x100, spearman, pearson: null, never NaN, when
--           undefined: fewer than two pairs, or constant scores or labels)
-- Params    none
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/table1.sql
--           xsbert sql --run runs/<id> --file sql/table1.sql

with

---------- imports

pairs as (
    select
        score,
        label,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
    where label is not null
        and score is not null
),

manifest as (
    select
        json_extract_string(content, '$.config.model') as model,
        json_extract_string(content, '$.config.mode') as mode,
        json_extract_string(content, '$.config.similarity') as similarity,
        json_extract_string(content, '$.config.layer')::integer as layer,
    from read_text(getvariable('run') || '/manifest.json')
),

---------- logic

-- average rank = rank() + (number of tied rows - 1) / 2
ranked as (
    select
        score,
        label,
        rank() over by_score
            + (count(*) over (by_score range between current row
                                           and current row) - 1) / 2
            as score_rank,
        rank() over by_label
            + (count(*) over (by_label range between current row
                                           and current row) - 1) / 2
            as label_rank,
    from pairs
    window
        by_score as (order by score),
        by_label as (order by label)
),

-- corr() is NaN, not null, over one pair or constant values: nullif
-- makes that null
correlations as (
    select
        count(*) as n_pairs,
        nullif(corr(score_rank, label_rank), 'nan'::double) as spearman,
        nullif(corr(score, label), 'nan'::double) as pearson,
    from ranked
),

table1 as (
    select
        manifest.model,
        manifest.mode,
        manifest.similarity,
        manifest.layer,
        correlations.n_pairs,
        100 * correlations.spearman as spearman_x100,
        correlations.spearman,
        correlations.pearson,
    from correlations
    cross join manifest
)

select * from table1;
