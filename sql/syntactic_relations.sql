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

.read sql/lib/cells_guard.sql
.read sql/lib/syntactic_top_cells.sql

with

---------- imports

-- which cells the run stores: a run without the cells this file needs stops
-- here (sql/lib/cells_guard.sql)
cells_guard as (
    from cells_guard([getvariable('run')], ['all'],
                     'syntactic_relations.sql needs every word cell',
                     'all')
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
