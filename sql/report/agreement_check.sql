-- agreement_check.sql: can two runs be compared cell by cell?
--
-- Question  agreement.sql joins two runs' cells on (pair_id, i, j). That
--           is a comparison only for the same pairs (same pair ids over
--           the same texts) tokenized alike. How many pair ids do the
--           runs share, how many of those hold the same texts, and how
--           many shared sentences do the two runs tokenize differently?
-- Paper     Fig 3/4 (the precondition of exact-vs-approximate agreement).
--           The report (jobs.report) runs this before agreement.sql and
--           skips agreement, saying why, when a count is off.
-- Inputs    pairs of run and run2: pair_id, sentence_id_a, sentence_id_b
--           sentences of run and run2: sentence_id, tokens
-- Grain     one row (the two runs).
-- Columns   n_shared_pairs          pair ids in both runs
--           n_same_texts            of those, pairs whose two sentence
--                                   ids are equal in both runs
--           n_retokenized_sentences sentence ids in both runs whose
--                                   token lists differ (another tokenizer
--                                   or truncation)
-- Params    none
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -cmd "set variable run2 = 'runs/<id2>'" -f sql/report/agreement_check.sql
--           xsbert sql --run runs/<id> --run2 runs/<id2> --file sql/report/agreement_check.sql

with

---------- imports

pairs_1 as (
    select
        pair_id,
        sentence_id_a,
        sentence_id_b,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
),

pairs_2 as (
    select
        pair_id,
        sentence_id_a,
        sentence_id_b,
    from read_parquet(getvariable('run2') || '/pairs/*.parquet')
),

sentences_1 as (
    select
        sentence_id,
        tokens,
    from read_parquet(getvariable('run') || '/sentences/*.parquet')
),

sentences_2 as (
    select
        sentence_id,
        tokens,
    from read_parquet(getvariable('run2') || '/sentences/*.parquet')
),

---------- logic

shared_pairs as (
    select
        count(*) as n_shared_pairs,
        count(*) filter (
            where p1.sentence_id_a = p2.sentence_id_a
                and p1.sentence_id_b = p2.sentence_id_b
        ) as n_same_texts,
    from pairs_1 as p1
    inner join pairs_2 as p2 using (pair_id)
),

retokenized as (
    select
        count(*) as n_retokenized_sentences,
    from sentences_1 as s1
    inner join sentences_2 as s2 using (sentence_id)
    where s1.tokens <> s2.tokens
),

agreement_check as (
    select
        shared_pairs.n_shared_pairs,
        shared_pairs.n_same_texts,
        retokenized.n_retokenized_sentences,
    from shared_pairs
    cross join retokenized
)

select * from agreement_check;
