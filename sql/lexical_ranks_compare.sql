-- lexical_ranks_compare.sql: do two runs (two models, layers or modes) rank
-- the same-token attributions alike?
--
-- Question  For the tokens both runs rank (lexical_ranks.sql), how do the
--           ranks compare, and what is their Spearman rank correlation?
-- Paper     Fig 10, Tables 3-4 (§5.4, App. D): lexical-rank Spearman 0.81
--           between Exact and Shelf at level 8 on QQP (148,315 pairs,
--           N = 100), words appearing 30 and more times. We read that as
--           30 same-token cells (min_count), not 30 occurrences.
-- Inputs    cells, pairs, sentences of run and of run2 (as in
--           lexical_ranks.sql)
--           manifest.json of run and run2: config.cells (every cell or
--           the same-token ones; --cells none is an error)
-- Grain     one row per token that has at least min_count same-token cells
--           in both runs (inner join on the token string: runs with
--           different tokenizers share fewer tokens).
-- Columns   token
--           n_1, mean_1, std_1, rank_1   run's lexical_ranks.sql row
--           n_2, mean_2, std_2, rank_2   run2's lexical_ranks.sql row
--           shared_rank_1, shared_rank_2 average ranks among the shared
--                  tokens only (1 = highest mean; tied means share the
--                  average of their positions): what spearman is over
--           n_shared   number of shared tokens (the same on every row)
--           spearman   Pearson correlation of shared_rank_1 and
--                  shared_rank_2 = Spearman's rho with ties averaged
--                  (scipy.stats.spearmanr); the same on every row, so one
--                  statement returns table and summary; null, never NaN,
--                  when undefined (one shared token, or all shared means
--                  tied in a run); no shared token: no row
-- Params    min_count        30     minimum n of a token in each run
--           include_special  true   rank special tokens ([CLS], <s>, ...)
--                                    too, as the paper does (punctuation is
--                                    always ranked); false: word tokens only
-- Run       duckdb -cmd "set variable run = 'runs/<id1>'" \
--                  -cmd "set variable run2 = 'runs/<id2>'" \
--                  -f sql/lexical_ranks_compare.sql
--           xsbert sql --run runs/<id1> --run2 runs/<id2> \
--                  --file sql/lexical_ranks_compare.sql

.read sql/lib/lexical_token_ranks.sql
.read sql/lib/cells_guard.sql

with

---------- imports

-- which cells the runs store: runs without the cells this file needs stop
-- here (sql/lib/cells_guard.sql)
cells_guard as (
    from cells_guard([getvariable('run'), getvariable('run2')],
                     ['all', 'same-token'],
                     'lexical_ranks_compare.sql needs the same-token cells',
                     'same-token or all')
),

---------- logic: each run's lexical ranks (sql/lib/lexical_token_ranks.sql,
---------- as in lexical_ranks.sql), once the guard holds

ranks_1 as (
    from lexical_token_ranks(getvariable('run'))
    where (select ok from cells_guard)
),

ranks_2 as (
    from lexical_token_ranks(getvariable('run2'))
    where (select ok from cells_guard)
),

---------- logic: the shared tokens and their rank correlation

shared as (
    select
        r1.token,
        r1.n as n_1,
        r1.mean as mean_1,
        r1.std as std_1,
        r1.rank as rank_1,
        r2.n as n_2,
        r2.mean as mean_2,
        r2.std as std_2,
        r2.rank as rank_2,
    from ranks_1 as r1
    inner join ranks_2 as r2 on r1.token = r2.token
),

-- average rank = rank() + (number of tied rows - 1) / 2
shared_ranks as (
    select
        *,
        rank() over by_mean_1
            + (count(*) over (by_mean_1 range between current row
                                                and current row) - 1) / 2
            as shared_rank_1,
        rank() over by_mean_2
            + (count(*) over (by_mean_2 range between current row
                                                and current row) - 1) / 2
            as shared_rank_2,
    from shared
    window
        by_mean_1 as (order by mean_1 desc),
        by_mean_2 as (order by mean_2 desc)
),

-- corr() is NaN, not null, over one token or constant ranks: nullif makes
-- that null
compared as (
    select
        *,
        count(*) over () as n_shared,
        nullif(corr(shared_rank_1, shared_rank_2) over (), 'nan'::double)
            as spearman,
    from shared_ranks
)

select * from compared
order by rank_1, token;
