-- syntactic_relations_pairs.sql: Fig 6's shares per pair, with intervals
--
-- Question  Per pair, how many of its top word cells (as in
--           syntactic_relations.sql) join nsubj with nsubj, two words of
--           the same function, two parsed words, or an unaligned or
--           unparsed word? And the shares over the run, each with a
--           bootstrap 95% interval over pairs (clusters of pairs that
--           share a sentence).
-- Paper     Fig 6 (§5.1): nsubj-nsubj, around 7% of the top
--           attributions, is by far the most frequent relation pair;
--           whether of all top cells or of those between two parsed words
--           is not stated: both are given (nsubj_share,
--           nsubj_share_of_parsed).
-- Inputs    as syntactic_relations.sql (the same syntactic_top_cells macro,
--           sql/lib/): word_cells, pairs, sentences, parses and
--           manifest.json of run; pairs again for the sentence ids
-- Clusters  relation_clusters 'sentence' (the default up to 50,000 pairs,
--           'pair' above): pairs that share a sentence, directly or
--           through other pairs, are one cluster
--           (the connected components of the pairs linked by a shared
--           sentence id; cluster_id is the smallest pair_id in it), since
--           their top cells are not independent; 'pair': every pair its
--           own (cheaper where sentences recur in very many pairs).
-- Intervals <share>_low, <share>_high: the percentile 95% interval (linear
--           interpolation) of the share in `resamples` resamples of the
--           clusters, each drawing as many clusters as there are, with
--           replacement, by the xs_hash macros (a seeded 32-bit integer
--           hash, sql/lib/resample.sql, as negation_signs.sql): the same
--           interval on every run of the file.
-- Grain     one row per pair with at least one top cell, by pair_id.
-- Columns   pair_id, cluster_id,
--           n_top        the pair's top cells
--           n_nsubj      of them nsubj-nsubj
--           n_same       two words of the same real relation
--           n_parsed     two words with a real relation (neither
--                        'unaligned' nor 'unparsed')
--           n_unaligned  n_top - n_parsed
--           on every row: n_pairs, n_clusters, resamples, cluster_by (the
--           relation_clusters that ran: 'sentence' or 'pair'), and each share
--           with its _low and _high: nsubj_share (sum n_nsubj / sum
--           n_top), nsubj_share_of_parsed (sum n_nsubj / sum n_parsed),
--           same_function_share (sum n_same / sum n_top),
--           same_share_of_parsed (sum n_same / sum n_parsed),
--           unaligned_share (sum n_unaligned / sum n_top). The sums are
--           syntactic_relations.sql's counts.
-- Params    top_share   0.10 (as in syntactic_relations.sql)
--           parser      (as in syntactic_relations.sql)
--           relation_clusters  'sentence' | 'pair'
--           resamples   2000 (fewer where clusters x 2000 > 40 million: at
--                       least 100; the resamples column says how many)
--           seed        0
-- Run       duckdb -cmd "set variable run = 'runs/<id>'" -f sql/syntactic_relations_pairs.sql
--           xsbert sql --run runs/<id> -f syntactic_relations_pairs --csv > fig6-pairs.csv

.read sql/lib/cells_guard.sql
.read sql/lib/syntactic_top_cells.sql
.read sql/lib/resample.sql

with recursive

---------- imports

-- which cells the run stores: a run without the cells this file needs stops
-- here (sql/lib/cells_guard.sql)
cells_guard as (
    from cells_guard([getvariable('run')], ['all'],
                     'syntactic_relations_pairs.sql needs every word cell',
                     'all')
),

pairs as (
    select
        pair_id,
        sentence_id_a,
        sentence_id_b,
    from read_parquet(getvariable('run') || '/pairs/*.parquet')
),

-- relation_clusters: the variable, else 'sentence' on a run of up to 50,000
-- pairs and 'pair' above (the components' query grows with the square of a
-- cluster's size)
settings as (
    select
        coalesce(
            getvariable('relation_clusters'),
            case
                when (select count(*) from pairs) <= 50000 then 'sentence'
                else 'pair'
            end
        ) as cluster_by,
        coalesce(getvariable('seed'), 0)::bigint as seed,
),

---------- logic: each pair's counts (its top cells: the macro above)

labelled as (
    select
        pair_id,
        relation_of_a,
        relation_of_b,
    from syntactic_top_cells(getvariable('run'), (select ok from cells_guard))
),

per_pair as (
    select
        pair_id,
        count(*) as n_top,
        count(*) filter (
            where relation_of_a = 'nsubj' and relation_of_b = 'nsubj'
        ) as n_nsubj,
        count(*) filter (
            where relation_of_a = relation_of_b
                and relation_of_a not in ('unaligned', 'unparsed')
        ) as n_same,
        count(*) filter (
            where relation_of_a not in ('unaligned', 'unparsed')
                and relation_of_b not in ('unaligned', 'unparsed')
        ) as n_parsed,
    from labelled
    group by 1
),

---------- logic: clusters of pairs that share a sentence

pair_sentences as (
    select pairs.pair_id, pairs.sentence_id_a as sentence_id,
    from pairs
    inner join per_pair on pairs.pair_id = per_pair.pair_id
    union
    select pairs.pair_id, pairs.sentence_id_b,
    from pairs
    inner join per_pair on pairs.pair_id = per_pair.pair_id
),

-- pairs with a sentence in common (each pair with itself too); none for
-- relation_clusters 'pair'
links as (
    select distinct
        one.pair_id,
        other.pair_id as linked,
    from pair_sentences as one
    inner join pair_sentences as other
        on one.sentence_id = other.sentence_id
    where (select cluster_by from settings) = 'sentence'
),

-- every pair reachable from a pair through links (union: each once)
reachable(pair_id, linked) as (
    select pair_id, linked from links
    union
    select reachable.pair_id, links.linked
    from reachable
    inner join links on reachable.linked = links.pair_id
),

components as (
    select
        pair_id,
        min(linked) as cluster_id,
    from reachable
    group by 1
),

counted as (
    select
        per_pair.pair_id,
        case settings.cluster_by
            when 'sentence' then components.cluster_id
            when 'pair' then per_pair.pair_id
            else error('syntactic_relations_pairs.sql: relation_clusters must be '
                       || 'sentence or pair, not ' || settings.cluster_by)
        end as cluster_id,
        per_pair.n_top,
        per_pair.n_nsubj,
        per_pair.n_same,
        per_pair.n_parsed,
        per_pair.n_top - per_pair.n_parsed as n_unaligned,
    from per_pair
    cross join settings
    left join components on per_pair.pair_id = components.pair_id
),

---------- logic: the shares and their intervals

clusters as (
    select
        row_number() over (order by cluster_id) - 1 as k,
        cluster_id,
        sum(n_top) as n_top,
        sum(n_nsubj) as n_nsubj,
        sum(n_same) as n_same,
        sum(n_parsed) as n_parsed,
        sum(n_unaligned) as n_unaligned,
    from counted
    group by cluster_id
),

cluster_count as (
    select count(*) as n_clusters from clusters
),

-- resamples: the variable, else xs_resamples' rule (sql/lib/resample.sql)
resample_count as (
    select
        xs_resamples(getvariable('resamples'), n_clusters) as resamples,
    from cluster_count
),

-- each resample b's draws: cluster numbers k (sql/lib/resample.sql)
draws as (
    select b, k,
    from xs_cluster_draws(
        (select n_clusters from cluster_count),
        (select seed from settings)
    )
),

-- per resample the five shares (a ratio with a zero denominator is null)
resampled as (
    select
        draws.b,
        sum(clusters.n_nsubj) / nullif(sum(clusters.n_top), 0) as nsubj_share,
        sum(clusters.n_nsubj) / nullif(sum(clusters.n_parsed), 0)
            as nsubj_share_of_parsed,
        sum(clusters.n_same) / nullif(sum(clusters.n_top), 0)
            as same_function_share,
        sum(clusters.n_same) / nullif(sum(clusters.n_parsed), 0)
            as same_share_of_parsed,
        sum(clusters.n_unaligned) / nullif(sum(clusters.n_top), 0)
            as unaligned_share,
    from draws
    inner join clusters on draws.k = clusters.k
    group by 1
),

shares as (
    select
        count(*) as n_pairs,
        (select n_clusters from cluster_count) as n_clusters,
        (select resamples from resample_count) as resamples,
        (select cluster_by from settings) as cluster_by,
        sum(n_nsubj) / nullif(sum(n_top), 0) as nsubj_share,
        sum(n_nsubj) / nullif(sum(n_parsed), 0) as nsubj_share_of_parsed,
        sum(n_same) / nullif(sum(n_top), 0) as same_function_share,
        sum(n_same) / nullif(sum(n_parsed), 0) as same_share_of_parsed,
        sum(n_unaligned) / nullif(sum(n_top), 0) as unaligned_share,
    from counted
),

intervals as (
    select
        quantile_cont(nsubj_share, 0.025) as nsubj_share_low,
        quantile_cont(nsubj_share, 0.975) as nsubj_share_high,
        quantile_cont(nsubj_share_of_parsed, 0.025)
            as nsubj_share_of_parsed_low,
        quantile_cont(nsubj_share_of_parsed, 0.975)
            as nsubj_share_of_parsed_high,
        quantile_cont(same_function_share, 0.025) as same_function_share_low,
        quantile_cont(same_function_share, 0.975)
            as same_function_share_high,
        quantile_cont(same_share_of_parsed, 0.025)
            as same_share_of_parsed_low,
        quantile_cont(same_share_of_parsed, 0.975)
            as same_share_of_parsed_high,
        quantile_cont(unaligned_share, 0.025) as unaligned_share_low,
        quantile_cont(unaligned_share, 0.975) as unaligned_share_high,
    from resampled
),

summarised as (
    select
        counted.*,
        shares.n_pairs,
        shares.n_clusters,
        shares.resamples,
        shares.cluster_by,
        shares.nsubj_share,
        intervals.nsubj_share_low,
        intervals.nsubj_share_high,
        shares.nsubj_share_of_parsed,
        intervals.nsubj_share_of_parsed_low,
        intervals.nsubj_share_of_parsed_high,
        shares.same_function_share,
        intervals.same_function_share_low,
        intervals.same_function_share_high,
        shares.same_share_of_parsed,
        intervals.same_share_of_parsed_low,
        intervals.same_share_of_parsed_high,
        shares.unaligned_share,
        intervals.unaligned_share_low,
        intervals.unaligned_share_high,
    from counted
    cross join shares
    cross join intervals
)

select * from summarised
order by pair_id;
