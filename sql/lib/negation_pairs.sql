-- negation_pairs.sql: the pairs that differ by one standalone "not", a table
-- macro that negation.sql calls for its run and negation_signs.sql for every
-- run it reads, and the not attribution's two definitions (each file reads
-- this one first: `.read sql/lib/negation_pairs.sql`, from the repository
-- root).
--
-- negation_pairs(runs): the pairs of the runs of the list `runs` (the same
-- pairs may be in several; one row per pair id, score and attribution_sum
-- the first run's) whose two texts, as words, differ by one standalone "not"
-- (lower-cased; a "not" whose removal gives the other side), with the side
-- that has it and the not-word's index and token positions.
-- Columns   pair_id, text_a, text_b, sentence_id_a, sentence_id_b, score,
--           attribution_sum, not_side ('a' | 'b'), not_index (0-based word),
--           not_tokens (the not-word's 0-based token positions: cells.i for
--           a, cells.j for b)
create or replace temp macro negation_pairs(runs) as table
    with

    -- one row per pair id (its texts and sentences are the same in every
    -- run that holds it; score and attribution_sum are the first run's)
    pairs as (
        select
            pair_id,
            first(text_a) as text_a,
            first(text_b) as text_b,
            first(sentence_id_a) as sentence_id_a,
            first(sentence_id_b) as sentence_id_b,
            first(score) as score,
            first(attribution_sum) as attribution_sum,
        from read_parquet(list_transform(runs, lambda r: r || '/pairs/*.parquet'),
                          union_by_name = true)
        group by pair_id
    ),

    sentences as (
        select
            sentence_id,
            list_transform(first(words), lambda w: lower(w)) as words,
            first(word_ids) as word_ids,
        from read_parquet(list_transform(runs, lambda r: r || '/sentences/*.parquet'),
                          union_by_name = true)
        group by sentence_id
    ),

    pair_words as (
        select
            pairs.*,
            sentences_a.words as words_a,
            sentences_b.words as words_b,
            sentences_a.word_ids as word_ids_a,
            sentences_b.word_ids as word_ids_b,
        from pairs
        inner join sentences as sentences_a
            on pairs.sentence_id_a = sentences_a.sentence_id
        inner join sentences as sentences_b
            on pairs.sentence_id_b = sentences_b.sentence_id
        where abs(len(sentences_a.words) - len(sentences_b.words)) = 1
    ),

    -- the 1-based positions k of a 'not' whose removal gives the other side
    not_positions as (
        select
            * exclude (words_a, words_b, word_ids_a, word_ids_b),
            word_ids_a,
            word_ids_b,
            list_filter(
                range(1, len(words_a) + 1),
                lambda k: words_a[k] = 'not'
                    and list_concat(words_a[1:k - 1], words_a[k + 1:]) = words_b
            ) as positions_a,
            list_filter(
                range(1, len(words_b) + 1),
                lambda k: words_b[k] = 'not'
                    and list_concat(words_b[1:k - 1], words_b[k + 1:]) = words_a
            ) as positions_b,
        from pair_words
    ),

    negation_pairs as (
        select
            * exclude (positions_a, positions_b, word_ids_a, word_ids_b),
            case when len(positions_a) > 0 then 'a' else 'b' end as not_side,
            coalesce(positions_a[1], positions_b[1]) - 1 as not_index,
            -- the 0-based token positions of the not-word (cells.i for a, .j for b)
            case when len(positions_a) > 0
                then list_filter(range(len(word_ids_a)),
                                 lambda t: word_ids_a[t + 1] = positions_a[1] - 1)
                else list_filter(range(len(word_ids_b)),
                                 lambda t: word_ids_b[t + 1] = positions_b[1] - 1)
            end as not_tokens,
        from not_positions
        where len(positions_a) > 0 or len(positions_b) > 0
    )

    select * from negation_pairs;

-- the not attribution under the variable `definition`: 'paper', the total of
-- the not-token's cells (not_total); 'word_cells', the not-word's word cells
-- (not_word_attribution); anything else stops with one line
create or replace temp macro not_attribution(definition, not_total,
                                             not_word_attribution) as
    case definition
        when 'paper' then not_total
        when 'word_cells' then not_word_attribution
        else error('definition must be paper or word_cells, not '
                   || definition)
    end;

-- its size relative to the prediction: over the score ('paper'), over the sum
-- of all word cells ('word_cells'); null where that is 0
create or replace temp macro not_relative(definition, not_total, score,
                                          not_word_attribution,
                                          word_attribution_sum) as
    case definition
        when 'paper' then not_total / nullif(score, 0)
        else not_word_attribution / nullif(word_attribution_sum, 0)
    end;
