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
-- How       one bounded top-k aggregate per pair, by the stored rank where
--           the store has one (top_cell_lists below), no sort of all word
--           cells; relations looked up per pair in each sentence's map
--           u -> relation. Cost on full QQP (404k pairs, 78M word cells):
--           bench/results/sql-run.md
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
            value_rank,
        from (
            from read_parquet(run || '/word_cells/*.parquet')
            -- stores before version 3 have no value_rank: null
            union all by name
            select null::float as value_rank,
            where false
        )
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

    -- per pair, the k largest keys, a bounded top-k aggregate (max / max_by
    -- keep the k largest), no sort of all word cells; cell = u * 65536 + v.
    -- Where the cells carry value_rank (store version 3: ascending, ties
    -- share their average rank, so it orders the cells as value does and
    -- equal values have equal ranks) the key is one integer,
    -- 2 * rank * 2^32 + (2^32 - 1 - cell): larger for a larger value, then
    -- for a smaller cell; otherwise (older stores) it is (value, -cell). A
    -- pair's cells are one commit: all ranked or none
    top_cell_lists as (
        select
            word_cells.pair_id,
            max(
                (2 * word_cells.value_rank)::bigint * 4294967296
                    + (4294967295 - (word_cells.u::bigint * 65536 + word_cells.v)),
                pair_sizes.k
            ) as top_keys_by_rank,
            max_by(
                word_cells.u::bigint * 65536 + word_cells.v,
                (word_cells.value, -(word_cells.u::bigint * 65536 + word_cells.v)),
                pair_sizes.k
            ) filter (where word_cells.value_rank is null) as top_cells_by_value,
        from word_cells
        inner join pair_sizes on word_cells.pair_id = pair_sizes.pair_id
        group by word_cells.pair_id
    ),

    top_cells as (
        select
            pair_id,
            coalesce(
                [4294967295 - key % 4294967296 for key in top_keys_by_rank],
                top_cells_by_value
            ) as cells,
        from top_cell_lists
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

    -- each parsed sentence's relation of word u: looked up per pair, not
    -- joined per top cell
    sentence_relations as (
        select
            sentence_id,
            map(list(u::bigint), list(relation)) as relation_of,
        from chosen_parses
        group by sentence_id
    ),

    -- a word without a parse row: 'unparsed'
    labelled as (
        select
            top_cells.pair_id,
            unnest([coalesce(relations_a.relation_of[cell // 65536], 'unparsed')
                    for cell in top_cells.cells]) as relation_of_a,
            unnest([coalesce(relations_b.relation_of[cell % 65536], 'unparsed')
                    for cell in top_cells.cells]) as relation_of_b,
        from top_cells
        inner join pairs on top_cells.pair_id = pairs.pair_id
        left join sentence_relations as relations_a
            on pairs.sentence_id_a = relations_a.sentence_id
        left join sentence_relations as relations_b
            on pairs.sentence_id_b = relations_b.sentence_id
    )

    select * from labelled;
