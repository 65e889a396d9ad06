-- negation.sql: how is a "not" attributed against the rest of the pair?
--
-- Question  In pairs whose two texts differ by one standalone "not" on one
--           side (the negation dataset: python -m jobs.attribute --dataset
--           negation), how much does the not-word contribute to the
--           similarity, and how often negatively?
-- Paper     Fig 8 (§5.2): the total attribution to the 'not' token is
--           negative in approximately 16% (off-the-shelf) and 9% (exact)
--           of the cases; in 90% of the cases the relative attribution is
--           under 8% (off-the-shelf) and 14% (exact) "of the prediction".
--           "The prediction" is the paper's term for f(a, b) (§3.1):
--           relative is not / f(a, b); relative_plus_one and
--           relative_to_sum are ours beside it, f(a, b) + 1 (Eq. 4's
--           sum) and sum(A).
--           Signs clear of the completeness error, with intervals:
--           negation_signs.sql.
-- Inputs    pairs of run: pair ids, sentence ids, score, attribution_sum
--           sentences of run: words (the tokenizer's words, as in
--           word_cells.u / v) and word_ids (token -> word)
--           cells of run: the not-token's row (side a) or column (side b)
--           word_cells of run: the not-word's cells, the word-cell sum
--           manifest.json of run: config.cells; a run of --cells
--           same-token or none is an error (it lacks the cells)
-- Detection any pair of any run qualifies when one side's word list,
--           compared case-insensitively, equals the other side's with one
--           word 'not' removed. A "not" is a whole word for the tokenizer:
--           "cannot" and "n't" are not. The first such position is used.
-- Definition the variable `definition`:
--           'paper' (default), the paper's: not_attribution is the total
--             attribution to the not token(s): the sum of their token
--             cells against every token of the other side, special tokens
--             included; relative = not_attribution / score, its share of
--             the prediction f(a, b).
--           'word_cells' (ours, an option): not_attribution is the sum of
--             the not-word's word cells against every word of the other
--             side (word x word means over tokens, special tokens in
--             neither); relative = not_attribution / word_attribution_sum,
--             numerator and denominator over the same cells.
-- Grain     one row per qualifying pair, in pair_id order.
-- Columns   pair_id, text_a, text_b, score, attribution_sum,
--           not_side         'a' | 'b': the side that has the extra "not"
--           not_index        its word index (word_cells.u for a, .v for b)
--           not_total        the not token(s)' cells summed, every token of
--                            the other side (with --min-abs: the stored
--                            ones; 0 when none is stored)
--           not_word_attribution  the not-word's word cells summed
--           word_attribution_sum  sum of all the pair's word cells
--           definition       'paper' | 'word_cells' (the variable)
--           not_attribution  not_total ('paper') or not_word_attribution
--           relative         not_total / score ('paper') or
--                            not_word_attribution / word_attribution_sum
--                            ('word_cells'); null when the denominator is 0
--           relative_plus_one  not_total / (score + 1)
--           relative_to_sum  not_total / attribution_sum (two other
--                            denominators than the paper's, ours,
--                            whatever the definition)
--           is_negative      not_attribution < 0
--           share_negative, p90_abs_relative, p90_abs_relative_plus_one,
--           p90_abs_relative_to_sum  over all rows: share of is_negative
--                            and the 90th percentiles of |relative|,
--                            |relative_plus_one|, |relative_to_sum|
--                            (linear interpolation, numpy's default);
--                            the same on every row
-- Params    definition ('paper')
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/negation.sql
--           xsbert sql --run runs/<id> --file sql/negation.sql
--           xsbert sql --run runs/<id> -f negation --var definition=word_cells

.read sql/lib/cells_guard.sql
.read sql/lib/negation_pairs.sql

with

---------- imports

-- which cells the run stores: a run without the cells this file needs stops
-- here (sql/lib/cells_guard.sql)
cells_guard as (
    from cells_guard([getvariable('run')], ['all'],
                     'negation.sql needs every cell',
                     'all')
),

-- the pairs that differ by one "not" (the macro above)
negation_pairs as (
    select * from negation_pairs([getvariable('run')])
),

cells as (
    select
        pair_id,
        i,
        j,
        value,
    from read_parquet(getvariable('run') || '/cells/*.parquet')
    where (select ok from cells_guard)
),

word_cells as (
    select
        pair_id,
        u,
        v,
        value,
    from read_parquet(getvariable('run') || '/word_cells/*.parquet')
    where (select ok from cells_guard)
),

---------- logic: the not-word's attribution

-- the paper's: the total attribution to the not token(s), every token of
-- the other side (special tokens included)
not_token_cells as (
    select
        cells.pair_id,
        sum(cells.value) as not_total,
    from cells
    inner join negation_pairs
        on cells.pair_id = negation_pairs.pair_id
    where (negation_pairs.not_side = 'a'
            and list_contains(negation_pairs.not_tokens, cells.i))
        or (negation_pairs.not_side = 'b'
            and list_contains(negation_pairs.not_tokens, cells.j))
    group by 1
),

-- ours: the not-word's word cells and the sum of all word cells
not_cells as (
    select
        word_cells.pair_id,
        sum(word_cells.value) filter (
            where (negation_pairs.not_side = 'a'
                    and word_cells.u = negation_pairs.not_index)
                or (negation_pairs.not_side = 'b'
                    and word_cells.v = negation_pairs.not_index)
        ) as not_attribution,
        sum(word_cells.value) as word_attribution_sum,
    from word_cells
    inner join negation_pairs
        on word_cells.pair_id = negation_pairs.pair_id
    group by 1
),

settings as (
    select coalesce(getvariable('definition'), 'paper') as definition
),

measured as (
    select
        negation_pairs.pair_id,
        negation_pairs.text_a,
        negation_pairs.text_b,
        negation_pairs.score,
        negation_pairs.attribution_sum,
        negation_pairs.not_side,
        negation_pairs.not_index,
        coalesce(not_token_cells.not_total, 0) as not_total,
        coalesce(not_cells.not_attribution, 0) as not_word_attribution,
        not_cells.word_attribution_sum,
        settings.definition,
    from negation_pairs
    cross join settings
    left join not_token_cells
        on negation_pairs.pair_id = not_token_cells.pair_id
    left join not_cells on negation_pairs.pair_id = not_cells.pair_id
),

negation as (
    select
        *,
        not_attribution(definition, not_total, not_word_attribution)
            as not_attribution,
        not_relative(definition, not_total, score, not_word_attribution,
                     word_attribution_sum) as relative,
        -- two other denominators than the paper's f(a, b): ours
        not_total / nullif(score + 1, 0) as relative_plus_one,
        not_total / nullif(attribution_sum, 0) as relative_to_sum,
    from measured
),

flagged as (
    select
        *,
        not_attribution < 0 as is_negative,
    from negation
),

summarised as (
    select
        *,
        avg(is_negative::double) over () as share_negative,
        quantile_cont(abs(relative), 0.9) over () as p90_abs_relative,
        quantile_cont(abs(relative_plus_one), 0.9) over ()
            as p90_abs_relative_plus_one,
        quantile_cont(abs(relative_to_sum), 0.9) over ()
            as p90_abs_relative_to_sum,
    from flagged
)

select * from summarised
order by pair_id;
