-- negation_signs.sql: how many "not" attributions are negative, counting
-- only the signs that are clear of the completeness error?
--
-- Question  Fig 8's count, error-aware. The same negation pairs attributed
--           at several N (one run each: run, and other_runs); per pair,
--           the not attribution at the smallest N whose completeness
--           error is below margin x |not|. Signs are counted only where
--           they are clear; how many are not is said. The share of
--           negative ones with an exact binomial 95% interval and a
--           bootstrap 95% interval over clusters of pairs.
-- Paper     Fig 8 (§5.2): approximately 16% (off-the-shelf) and 9% (exact)
--           of all not-attributions are negative (the total attribution to
--           the not-token); the paper says nothing of the completeness
--           error. negation.sql gives the run's values at its own N.
-- Inputs    sentences of each run: words, word_ids (which pairs differ by
--           one "not": sql/lib/negation_pairs.sql, as negation.sql)
--           pairs of run and of each of other_runs: score,
--           attribution_sum, completeness_error, steps_a, steps_b
--           cells (definition 'paper') or word_cells ('word_cells') of
--           each run
--           manifest.json of each run: every run must store every cell
--           and share model, mode, similarity and layer (else it stops
--           with one line saying which differs)
-- N         a pair's N in a run is greatest(steps_a, steps_b): one N for
--           all pairs of a fixed-N run (--steps), per pair for an adaptive
--           one (--tolerance). Runs of other pairs add nothing: a pair
--           counts the runs that hold it.
-- Clear     a run's value is clear when |completeness_error| < margin x
--           |not_attribution|; per pair the clear value of the smallest N
--           is used (ties: the smaller |completeness error|). A pair with
--           no clear value is not counted: is_clear false, is_negative
--           null, chosen_steps null.
-- Clusters  pairs from one source are resampled together. sign_clusters
--           'source' (the default): the negation dataset names a pair by
--           its STS-B pair and :1 or :2 (the side the sentence came
--           from), so cluster_id is pair_id without that suffix (both
--           sentences of one STS-B pair are one cluster); any other id is
--           its own cluster. 'pair': every pair its own.
-- Intervals ci_low, ci_high: exact (Clopper-Pearson) binomial 95% interval
--           of n_negative / n_clear, pairs taken as independent, found by
--           bisection (60 halvings) on the binomial tail. boot_low,
--           boot_high: percentile 95% interval (linear interpolation) of
--           the share in `resamples` resamples of the clusters that hold
--           a clear pair, each drawing as many clusters as there are with
--           replacement; the draws come from xs_hash, a seeded 32-bit
--           integer hash, so the interval is the same on every run of the
--           file (sql/lib/resample.sql, as syntactic_relations_pairs.sql).
-- Grain     one row per negation pair of the runs (a pair in any of them),
--           by pair_id.
-- Columns   pair_id, cluster_id, text_a, text_b,
--           n_runs           runs that hold the pair
--           steps, not_attributions, completeness_errors  lists, one
--                            element per run, by N
--           is_sign_unstable the sign of not_attribution differs between
--                            the runs
--           is_clear, chosen_steps  whether some N is clear, and which
--           not_attribution, completeness_error, score, attribution_sum,
--           relative, relative_plus_one, relative_to_sum  at chosen_steps
--                            (as negation.sql's columns; null when not
--                            clear)
--           is_negative      not_attribution < 0 (null when not clear)
--           on every row: definition, margin, n_pairs, n_clear,
--           n_not_clear, n_negative, share_negative (n_negative /
--           n_clear), ci_low, ci_high, n_clusters, resamples, boot_low,
--           boot_high, n_unstable, and over the clear pairs
--           p90_abs_relative, p90_abs_relative_plus_one,
--           p90_abs_relative_to_sum
-- Params    other_runs  (none) a list of run directories: the same pairs
--                       at other N (xsbert sql: comma-separated)
--           margin      0.1
--           definition  'paper' | 'word_cells' (as in negation.sql)
--           sign_clusters  'source' | 'pair'
--           resamples   2000 (fewer where clusters x 2000 > 40 million: at
--                       least 100; the resamples column says how many)
--           seed        0
-- Run       duckdb -cmd "set variable run = 'runs/<N=32>'" -cmd "set variable other_runs = ['runs/<N=64>', 'runs/<N=128>']" -f sql/negation_signs.sql
--           xsbert sql --run runs/<N=32> -f negation_signs --var other_runs=runs/<N=64>,runs/<N=128>

.read sql/lib/negation_pairs.sql

-- every run this file reads: run and other_runs, each once
create or replace temp macro negation_sign_runs() as
    list_distinct(list_concat([getvariable('run')],
                              coalesce(getvariable('other_runs'), []::varchar[])));

.read sql/lib/resample.sql

-- P(X >= k) for X ~ Binomial(n, p), 0 < p < 1
create or replace temp macro xs_binomial_tail(k, n, p) as
    coalesce(list_sum(list_transform(
        range(k, n + 1),
        lambda i: exp(lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1)
                      + i * ln(p) + (n - i) * ln(1 - p))
    )), 0);

-- the exact (Clopper-Pearson) 95% interval of k successes in n trials:
-- the p where P(X >= k) = 0.025 (0 for k = 0) and where P(X <= k) = 0.025
-- (1 for k = n), each by 60 halvings of [0, 1] (a reduce over 61 copies of
-- the starting bounds); null for n = 0
create or replace temp macro xs_binomial_low(k, n) as
    case
        when n = 0 then null
        when k = 0 then 0.0
        else list_reduce(
            list_transform(range(61),
                           lambda step: {'lo': 0.0::double, 'hi': 1.0::double}),
            lambda bounds, unused: case
                when xs_binomial_tail(k, n, (bounds.lo + bounds.hi) / 2) < 0.025
                    then {'lo': (bounds.lo + bounds.hi) / 2, 'hi': bounds.hi}
                else {'lo': bounds.lo, 'hi': (bounds.lo + bounds.hi) / 2}
            end
        ).lo
    end;

create or replace temp macro xs_binomial_high(k, n) as
    case
        when n = 0 then null
        when k = n then 1.0
        else list_reduce(
            list_transform(range(61),
                           lambda step: {'lo': 0.0::double, 'hi': 1.0::double}),
            lambda bounds, unused: case
                when 1 - xs_binomial_tail(k + 1, n, (bounds.lo + bounds.hi) / 2)
                    > 0.025
                    then {'lo': (bounds.lo + bounds.hi) / 2, 'hi': bounds.hi}
                else {'lo': bounds.lo, 'hi': (bounds.lo + bounds.hi) / 2}
            end
        ).hi
    end;

with

---------- imports

-- each run's settings; every run must hold every cell, and all must share
-- the model, mode, similarity and layer (else stop here, saying which)
run_settings as (
    select
        regexp_replace(filename, '/manifest[.]json$', '') as run_dir,
        coalesce(json_extract_string(content, '$.config.cells'), 'all')
            as cells,
        concat_ws(', ',
                  'model ' || coalesce(json_extract_string(content, '$.config.model'), '?'),
                  'mode ' || coalesce(json_extract_string(content, '$.config.mode'), '?'),
                  'similarity ' || coalesce(json_extract_string(content, '$.config.similarity'), '?'),
                  'layer ' || coalesce(json_extract_string(content, '$.config.layer'), '?'))
            as setting,
    from read_text(list_transform(negation_sign_runs(),
                                  lambda r: r || '/manifest.jso[n]'))
),

runs_guard as (
    select
        coalesce(bool_and(case
            when cells = 'all' then true
            else error('negation_signs.sql needs every cell; run ' || run_dir
                       || ' stores --cells ' || cells
                       || ' (attribute it with --cells all)')
        end), true)
        and case
            when count(distinct setting) <= 1 then true
            else error('negation_signs.sql: the runs must share model, mode, '
                       || 'similarity and layer; they hold '
                       || string_agg(distinct setting, ' / '))
        end as ok,
    from run_settings
),

-- the pairs of the runs that differ by one "not" (the macro above)
negation_pairs as (
    select * from negation_pairs(negation_sign_runs())
),

run_pairs as (
    select
        regexp_replace(filename, '/pairs/[^/]*$', '') as run_dir,
        pair_id,
        score,
        attribution_sum,
        completeness_error,
        greatest(steps_a, steps_b) as steps,
    from read_parquet(list_transform(negation_sign_runs(),
                                     lambda r: r || '/pairs/*.parquet'),
                      filename = true, union_by_name = true)
    where pair_id in (select pair_id from negation_pairs)
        and (select ok from runs_guard)
),

run_cells as (
    select
        regexp_replace(filename, '/cells/[^/]*$', '') as run_dir,
        pair_id,
        i,
        j,
        value,
    from read_parquet(list_transform(negation_sign_runs(),
                                     lambda r: r || '/cells/*.parquet'),
                      filename = true, union_by_name = true)
    where pair_id in (select pair_id from negation_pairs)
        and (select ok from runs_guard)
),

run_word_cells as (
    select
        regexp_replace(filename, '/word_cells/[^/]*$', '') as run_dir,
        pair_id,
        u,
        v,
        value,
    from read_parquet(list_transform(negation_sign_runs(),
                                     lambda r: r || '/word_cells/*.parquet'),
                      filename = true, union_by_name = true)
    where pair_id in (select pair_id from negation_pairs)
        and (select ok from runs_guard)
),

settings as (
    select
        coalesce(getvariable('definition'), 'paper') as definition,
        coalesce(getvariable('margin'), 0.1)::double as margin,
        coalesce(getvariable('sign_clusters'), 'source') as cluster_by,
        coalesce(getvariable('seed'), 0)::bigint as seed,
),

---------- logic: the not attribution in each run (as negation.sql)

not_token_cells as (
    select
        run_cells.run_dir,
        run_cells.pair_id,
        sum(run_cells.value) as not_total,
    from run_cells
    inner join negation_pairs
        on run_cells.pair_id = negation_pairs.pair_id
    where (negation_pairs.not_side = 'a'
            and list_contains(negation_pairs.not_tokens, run_cells.i))
        or (negation_pairs.not_side = 'b'
            and list_contains(negation_pairs.not_tokens, run_cells.j))
    group by 1, 2
),

not_word_cells as (
    select
        run_word_cells.run_dir,
        run_word_cells.pair_id,
        sum(run_word_cells.value) filter (
            where (negation_pairs.not_side = 'a'
                    and run_word_cells.u = negation_pairs.not_index)
                or (negation_pairs.not_side = 'b'
                    and run_word_cells.v = negation_pairs.not_index)
        ) as not_word_attribution,
        sum(run_word_cells.value) as word_attribution_sum,
    from run_word_cells
    inner join negation_pairs
        on run_word_cells.pair_id = negation_pairs.pair_id
    group by 1, 2
),

measured as (
    select
        run_pairs.*,
        coalesce(not_token_cells.not_total, 0) as not_total,
        coalesce(not_word_cells.not_word_attribution, 0)
            as not_word_attribution,
        not_word_cells.word_attribution_sum,
        settings.definition,
        settings.margin,
    from run_pairs
    cross join settings
    left join not_token_cells
        on run_pairs.run_dir = not_token_cells.run_dir
        and run_pairs.pair_id = not_token_cells.pair_id
    left join not_word_cells
        on run_pairs.run_dir = not_word_cells.run_dir
        and run_pairs.pair_id = not_word_cells.pair_id
),

valued as (
    select
        *,
        not_attribution(definition, not_total, not_word_attribution)
            as not_attribution,
        not_relative(definition, not_total, score, not_word_attribution,
                     word_attribution_sum) as relative,
        not_total / nullif(score + 1, 0) as relative_plus_one,
        not_total / nullif(attribution_sum, 0) as relative_to_sum,
    from measured
),

flagged as (
    select
        *,
        abs(completeness_error) < margin * abs(not_attribution) as is_clear_here,
    from valued
),

---------- logic: per pair, the clear value of the smallest N

per_pair as (
    select
        pair_id,
        count(*) as n_runs,
        list(steps order by steps, abs(completeness_error)) as steps,
        list(not_attribution order by steps, abs(completeness_error))
            as not_attributions,
        list(completeness_error order by steps, abs(completeness_error))
            as completeness_errors,
        min(sign(not_attribution)) <> max(sign(not_attribution))
            as is_sign_unstable,
        arg_min(
            {'steps': steps, 'not_attribution': not_attribution,
             'completeness_error': completeness_error, 'score': score,
             'attribution_sum': attribution_sum, 'relative': relative,
             'relative_plus_one': relative_plus_one,
             'relative_to_sum': relative_to_sum},
            steps + abs(completeness_error) / 1e6
        ) filter (where is_clear_here) as chosen,
    from flagged
    group by 1
),

signs as (
    select
        negation_pairs.pair_id,
        case settings.cluster_by
            when 'source' then regexp_replace(negation_pairs.pair_id, ':[12]$', '')
            when 'pair' then negation_pairs.pair_id
            else error('negation_signs.sql: sign_clusters must be source or pair, '
                       || 'not ' || settings.cluster_by)
        end as cluster_id,
        negation_pairs.text_a,
        negation_pairs.text_b,
        coalesce(per_pair.n_runs, 0) as n_runs,
        per_pair.steps,
        per_pair.not_attributions,
        per_pair.completeness_errors,
        coalesce(per_pair.is_sign_unstable, false) as is_sign_unstable,
        per_pair.chosen is not null as is_clear,
        per_pair.chosen.steps as chosen_steps,
        per_pair.chosen.not_attribution as not_attribution,
        per_pair.chosen.completeness_error as completeness_error,
        per_pair.chosen.score as score,
        per_pair.chosen.attribution_sum as attribution_sum,
        per_pair.chosen.relative as relative,
        per_pair.chosen.relative_plus_one as relative_plus_one,
        per_pair.chosen.relative_to_sum as relative_to_sum,
        per_pair.chosen.not_attribution < 0 as is_negative,
    from negation_pairs
    cross join settings
    left join per_pair on negation_pairs.pair_id = per_pair.pair_id
),

---------- logic: the count and its intervals

counts as (
    select
        count(*) as n_pairs,
        count(*) filter (where is_clear) as n_clear,
        count(*) filter (where not is_clear) as n_not_clear,
        count(*) filter (where is_negative) as n_negative,
        count(*) filter (where is_sign_unstable) as n_unstable,
        quantile_cont(abs(relative), 0.9) filter (where is_clear)
            as p90_abs_relative,
        quantile_cont(abs(relative_plus_one), 0.9) filter (where is_clear)
            as p90_abs_relative_plus_one,
        quantile_cont(abs(relative_to_sum), 0.9) filter (where is_clear)
            as p90_abs_relative_to_sum,
    from signs
),

binomial as (
    select
        n_negative / nullif(n_clear, 0) as share_negative,
        xs_binomial_low(n_negative, n_clear) as ci_low,
        xs_binomial_high(n_negative, n_clear) as ci_high,
    from counts
),

-- the clusters that hold a clear pair, numbered 0 .. n - 1
clusters as (
    select
        row_number() over (order by cluster_id) - 1 as k,
        cluster_id,
        count(*) filter (where is_clear) as n_clear,
        count(*) filter (where is_negative) as n_negative,
    from signs
    group by cluster_id
    having count(*) filter (where is_clear) > 0
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

resampled as (
    select
        draws.b,
        sum(clusters.n_negative) / sum(clusters.n_clear) as share,
    from draws
    inner join clusters on draws.k = clusters.k
    group by 1
),

bootstrap as (
    select
        (select n_clusters from cluster_count) as n_clusters,
        (select resamples from resample_count) as resamples,
        quantile_cont(share, 0.025) as boot_low,
        quantile_cont(share, 0.975) as boot_high,
    from resampled
),

summarised as (
    select
        signs.*,
        settings.definition,
        settings.margin,
        counts.n_pairs,
        counts.n_clear,
        counts.n_not_clear,
        counts.n_negative,
        binomial.share_negative,
        binomial.ci_low,
        binomial.ci_high,
        bootstrap.n_clusters,
        bootstrap.resamples,
        bootstrap.boot_low,
        bootstrap.boot_high,
        counts.n_unstable,
        counts.p90_abs_relative,
        counts.p90_abs_relative_plus_one,
        counts.p90_abs_relative_to_sum,
    from signs
    cross join settings
    cross join counts
    cross join binomial
    cross join bootstrap
)

select * from summarised
order by pair_id;
