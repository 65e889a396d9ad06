-- syntactic_relations.sql: which syntactic functions do the most
-- strongly attributed word pairs have?
--
-- Question  Per pair, take the top top_share of its word cells by value
--           (the largest positive attributions). Which pairs of
--           dependency relations do their two words have, and how often
--           do the two words have the same function (nsubj ~ nsubj)?
-- Paper     Fig 6 (§5.1): relations of the top 10% word pairs per pair,
--           all STS test pairs (labels inside multi-word expressions and
--           coordinations replaced by the nearest non-phrase-internal
--           ancestor's: parses.deprel); stanza parses. Top-contributing
--           pairs join words of identical function; nsubj-nsubj, around
--           7% of the top attributions, is by far the most frequent and
--           "not a large share of all top attributions"; the models
--           "regard a wide range of relations". Our parses may be spaCy's
--           (UD labels mapped), not stanza's: a difference wherever Fig 6
--           is compared. Intervals over pairs: syntactic_relations_pairs.sql.
-- Inputs    word_cells of run (u, v index sentences.words of a and b)
--           pairs, sentences of run: sentence ids, number of words
--           manifest.json of run: config.cells; a run of --cells
--           same-token or none is an error (it lacks the cells)
--           parses of run (python -m jobs.parse --run DIR): deprel per
--           (sentence_id, u); when it holds several parsers, stanza's
--           rows are used if present (else the first parser by name),
--           or the parser named by the `parser` variable
-- Top cells per pair: the k = ceil(top_share * U_a * U_b) word cells of
--           largest value (at least 1; U = words of a side); ties in
--           value are broken by the smaller u, then the smaller v. With
--           --min-abs only the stored cells can be chosen.
-- How       One bounded top-k aggregate per pair, by the stored rank
--           where the store has one (the macro below), no sort of all
--           word cells; relations looked up per pair in each sentence's
--           map u -> relation. Cost on full QQP (404k pairs, 78M word
--           cells): bench/results/sql-run.md
-- Relations a word that did not align one-to-one with a parser word has
--           no deprel: it is counted as relation 'unaligned'; a word of
--           a sentence that has no parse at all as 'unparsed'. Nothing is
--           dropped: sum(n) = number of top cells.
-- Grain     one row per unordered relation pair (relation_a <=
--           relation_b), most frequent first.
-- Columns   relation_a, relation_b, n (top cells with these relations),
--           share (n / all top cells), is_same_function (relation_a =
--           relation_b, both real relations),
--           same_function_share, mixed_share, unaligned_share: shares of
--           all top cells whose two words have the same relation / two
--           different real relations / at least one 'unaligned' or
--           'unparsed' word; the same on every row, and
--           same_function_share + mixed_share + unaligned_share = 1
--           (the paper's same-vs-mixed split over parsed words is
--           same_function_share / (same_function_share + mixed_share))
-- Params    top_share  0.10
--           parser     (the rule above)  'stanza' | 'spacy'
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/syntactic_relations.sql
--           xsbert sql --run runs/<id> --file sql/syntactic_relations.sql --var top_share=0.05

-- the relations of the top word cells of a run's pairs: one row per top
-- cell (pair_id, relation_of_a, relation_of_b), from word_cells only
-- where `ok` (the cells guard); the same text in syntactic_relations.sql
-- and syntactic_relations_pairs.sql (a test keeps it so)
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
                = 'all' then true
            else error('syntactic_relations.sql needs every word cell; run ' || getvariable('run')
                       || ' stores --cells '
                       || json_extract_string(content, '$.config.cells')
                       || ' (attribute it with --cells all)')
        end), true) as ok,
    from read_text(getvariable('run') || '/manifest.jso[n]')
),

---------- logic: the relations of each pair's top cells (the macro above)

labelled as (
    select
        relation_of_a,
        relation_of_b,
    from syntactic_top_cells(getvariable('run'), (select ok from cells_guard))
),

relation_pairs as (
    select
        least(relation_of_a, relation_of_b) as relation_a,
        greatest(relation_of_a, relation_of_b) as relation_b,
        count(*) as n,
    from labelled
    group by 1, 2
),

classified as (
    select
        *,
        relation_a = relation_b
            and relation_a not in ('unaligned', 'unparsed')
            as is_same_function,
        relation_a in ('unaligned', 'unparsed')
            or relation_b in ('unaligned', 'unparsed')
            as is_unaligned,
    from relation_pairs
),

shares as (
    select
        relation_a,
        relation_b,
        n,
        n / sum(n) over () as share,
        is_same_function,
        coalesce(sum(n) filter (where is_same_function) over (), 0)
            / sum(n) over () as same_function_share,
        coalesce(
            sum(n) filter (where not is_same_function and not is_unaligned)
                over (),
            0
        ) / sum(n) over () as mixed_share,
        coalesce(sum(n) filter (where is_unaligned) over (), 0)
            / sum(n) over () as unaligned_share,
    from classified
)

select * from shares
order by n desc, relation_a, relation_b;
