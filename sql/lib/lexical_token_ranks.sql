-- lexical_token_ranks.sql: one run's lexical ranks, a table macro that
-- lexical_ranks.sql calls for its run and lexical_ranks_compare.sql for run
-- and run2 (each reads this file first: `.read sql/lib/lexical_token_ranks.sql`,
-- from the repository root).
--
-- lexical_token_ranks(run): the run's same-token cells, without the special
-- tokens' (the tokens without a word id) unless include_special, per token
-- with at least min_count cells; rank 1 = highest mean, ties share the
-- smaller rank (rank()).
-- Columns   token, n, mean, std, rank
-- Params    min_count 30, include_special true (as in lexical_ranks.sql)
create or replace temp macro lexical_token_ranks(run) as table
    with
    same_token_cells as (
        select
            token_a as token,
            value,
        from read_parquet(run || '/cells/*.parquet')
        where token_a = token_b
            -- the cells of stored pairs only: a wave's cells are written
            -- before its pairs part commits it (docs/STORE.md)
            and pair_id in (
                select pair_id from read_parquet(run || '/pairs/*.parquet')
            )
    ),
    special_tokens as (
        select distinct
            unnest([t for t, k in tokens if word_ids[k] is null]) as token,
        from read_parquet(run || '/sentences/*.parquet')
    ),
    token_stats as (
        select
            token,
            count(*) as n,
            avg(value) as mean,
            stddev_samp(value) as std,
        from same_token_cells
        where coalesce(getvariable('include_special'), true)
            or token not in (select token from special_tokens)
        group by 1
        having count(*) >= coalesce(getvariable('min_count'), 30)
    )
    select
        token,
        n,
        mean,
        std,
        rank() over (order by mean desc) as rank,
    from token_stats;
