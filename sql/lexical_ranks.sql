-- lexical_ranks.sql: how much does a token attribute to the same token
-- on the other side of the pair?
--
-- Question  Which tokens, matched with themselves across a pair
--           (token_a = token_b), carry the largest attribution, and how
--           much does it vary?
-- Paper     Fig 10, Tables 3-4 (§5.4): lexical ranks of words appearing
--           30 and more times; we read that as 30 same-token cells
--           (min_count), not 30 occurrences of the word.
-- Inputs    cells     of run: the same-token cells, over all pairs
--           pairs     of run: the pair ids (cells of stored pairs only)
--           sentences of run: the special tokens are the tokens without a
--                             word id ([CLS], [SEP], <s>, </s>, ...)
--           manifest.json of run: config.cells; every cell or the
--                             same-token ones (--cells same-token) give
--                             the same rows; --cells none is an error
-- Grain     one row per token with at least min_count same-token cells.
-- Columns   token  the tokenizer's own token (e.g. 'house', '##ing', 'Ġhouse')
--           n      same-token cells of the token over all pairs (a token
--                  twice in a and twice in b gives 4 cells)
--           mean   avg(value)
--           std    sample standard deviation of value (null when n = 1)
--           rank   1 = highest mean; ties share the smaller rank (rank())
-- Params    min_count        30     minimum n of a token
--           include_special  true   the paper's definition: special tokens
--                                    ([CLS], EOS, <s>, ...) are ranked with the
--                                    rest (they come last in the paper's
--                                    Fig 10 / Tables 3-4), as is punctuation;
--                                    false: word tokens only (content view)
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/lexical_ranks.sql
--           xsbert sql --run runs/<id> --file sql/lexical_ranks.sql --var min_count=10

-- One run's lexical ranks (a table macro: the same text in lexical_ranks.sql
-- and lexical_ranks_compare.sql, which calls it for run and run2; a test
-- keeps the two copies equal): its same-token cells, without the special
-- tokens' (the tokens without a word id) unless include_special, per token
-- with at least min_count cells; rank 1 = highest mean, ties share the
-- smaller rank (rank())
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

with

---------- imports

-- which cells the run stores (jobs.attribute --cells, in manifest.json; runs
-- before the option, and a run without manifest.json (a glob that matches
-- nothing: no row), store every cell); a run without the cells this file
-- needs stops here
cells_guard as (
    select
        coalesce(bool_and(case
            when coalesce(json_extract_string(content, '$.config.cells'), 'all')
                <> 'none' then true
            else error('lexical_ranks.sql needs the same-token cells; run ' || getvariable('run')
                       || ' stores --cells '
                       || json_extract_string(content, '$.config.cells')
                       || ' (attribute it with --cells same-token or all)')
        end), true) as ok,
    from read_text(getvariable('run') || '/manifest.jso[n]')
),

---------- logic: the macro above, once the guard holds

ranked as (
    from lexical_token_ranks(getvariable('run'))
    where (select ok from cells_guard)
)

select * from ranked
order by rank, token;
