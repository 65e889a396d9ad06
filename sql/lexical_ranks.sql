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
--                                    Tables 3-4 and §5.4), as is punctuation;
--                                    false: word tokens only (content view)
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/lexical_ranks.sql
--           xsbert sql --run runs/<id> --file sql/lexical_ranks.sql --var min_count=10

.read sql/lib/lexical_token_ranks.sql
.read sql/lib/cells_guard.sql

with

---------- imports

-- which cells the run stores: a run without the cells this file needs stops
-- here (sql/lib/cells_guard.sql)
cells_guard as (
    from cells_guard([getvariable('run')], ['all', 'same-token'],
                     'lexical_ranks.sql needs the same-token cells',
                     'same-token or all')
),

---------- logic: the run's lexical ranks (sql/lib/lexical_token_ranks.sql),
---------- once the guard holds

ranked as (
    from lexical_token_ranks(getvariable('run'))
    where (select ok from cells_guard)
)

select * from ranked
order by rank, token;
