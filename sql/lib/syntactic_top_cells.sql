-- syntactic_top_cells.sql: the syntactic relations of a run's top word
-- cells, a table macro that syntactic_relations.sql and
-- syntactic_relations_pairs.sql call (each reads this file first:
-- `.read sql/lib/syntactic_top_cells.sql`, from the repository root).
--
-- syntactic_top_cells(run, ok): one row per top cell of each pair of the run
-- (the top share top_share of its word cells by value, at least one;
-- bounded top-k, ties to the smaller cell), from word_cells only where `ok`
-- (the caller's cells guard), each word's relation from the chosen parser's
-- parses (variable parser; default stanza where the run has it, else the
-- first by name): 'unaligned' for a word the parser did not align,
-- 'unparsed' for a sentence it did not parse.
-- Columns   pair_id, relation_of_a, relation_of_b
-- Params    top_share 0.10, parser (as in syntactic_relations.sql)
create or replace temp macro syntactic_top_cells(run, ok) as table
    with

    word_cells as (
        select
            pair_id,
            u,
            v,
            value,
        from read_parquet(run || '/word_cells/*.parquet')
        where ok
    ),

    pairs as (
        select
            pair_id,
            sentence_id_a,
            sentence_id_b,
        from read_parquet(run || '/pairs/*.parquet')
    ),

    sentences as (
        select
            sentence_id,
            n_words,
        from read_parquet(run || '/sentences/*.parquet')
    ),

    parses as (
        select
            sentence_id,
            u,
            deprel,
            parser,
        from read_parquet(run || '/parses/*.parquet')
    ),

    parsers as (
        select distinct
            parser,
        from read_parquet(run || '/parses/*.parquet')
    ),

    ---------- logic: the top cells of each pair

    pair_sizes as (
        select
            pairs.pair_id,
            pairs.sentence_id_a,
            pairs.sentence_id_b,
            greatest(
                1,
                ceil(
                    coalesce(getvariable('top_share'), 0.10)
                    * sentences_a.n_words * sentences_b.n_words
                )
            )::bigint as k,
        from pairs
        inner join sentences as sentences_a
            on pairs.sentence_id_a = sentences_a.sentence_id
        inner join sentences as sentences_b
            on pairs.sentence_id_b = sentences_b.sentence_id
    ),

    -- max_by keeps, per pair, the k cells of largest (value, -cell) where
    -- cell = u * 65536 + v: a bounded top-k aggregate, no sort of all word cells
    top_cell_lists as (
        select
            word_cells.pair_id,
            pair_sizes.sentence_id_a,
            pair_sizes.sentence_id_b,
            max_by(
                word_cells.u::bigint * 65536 + word_cells.v,
                (word_cells.value, -(word_cells.u::bigint * 65536 + word_cells.v)),
                pair_sizes.k
            ) as top_cells,
        from word_cells
        inner join pair_sizes on word_cells.pair_id = pair_sizes.pair_id
        group by all
    ),

    top_cells as (
        select
            pair_id,
            sentence_id_a,
            sentence_id_b,
            cell // 65536 as u,
            cell % 65536 as v,
        from (
            select
                *,
                unnest(top_cells) as cell,
            from top_cell_lists
        )
    ),

    ---------- logic: their relations

    chosen_parses as (
        select
            sentence_id,
            u,
            coalesce(deprel, 'unaligned') as relation,
        from parses
        where parser = (
            select
                coalesce(
                    getvariable('parser'),
                    case
                        when bool_or(parser = 'stanza') then 'stanza'
                        else min(parser)
                    end
                )
            from parsers
        )
    ),

    labelled as (
        select
            top_cells.pair_id,
            coalesce(parses_a.relation, 'unparsed') as relation_of_a,
            coalesce(parses_b.relation, 'unparsed') as relation_of_b,
        from top_cells
        left join chosen_parses as parses_a
            on top_cells.sentence_id_a = parses_a.sentence_id
            and top_cells.u = parses_a.u
        left join chosen_parses as parses_b
            on top_cells.sentence_id_b = parses_b.sentence_id
            and top_cells.v = parses_b.u
    )

    select * from labelled;
