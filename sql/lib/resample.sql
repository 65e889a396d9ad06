-- resample.sql: the seeded draws of the bootstrap intervals of
-- negation_signs.sql and syntactic_relations_pairs.sql (each reads this file
-- first: `.read sql/lib/resample.sql`, from the repository root): the same
-- draws on every run of a file, whatever the engine's threads.
--
-- one xor-shift-multiply step of lowbias32 (C. Wellons' 32-bit integer
-- hash), and the hash: x in [0, 2^32) -> [0, 2^32)
create or replace temp macro xs_hash_step(x, shift, factor) as
    (xor(x, x >> shift) * factor) % 4294967296;

create or replace temp macro xs_hash(x) as
    xs_hash_step(xs_hash_step(xs_hash_step(x::ubigint, 16, 2146121005),
                              15, 2221713035), 16, 1);

-- the bootstrap's draws: resample b's hash from the seed, then the d-th
-- draw's index in [0, n) from it
create or replace temp macro xs_resample_hash(seed, b) as
    xs_hash((seed * 2654435769 + b) % 4294967296);

create or replace temp macro xs_draw(resample_hash, d, n) as
    (xs_hash((resample_hash + d) % 4294967296) * n) >> 32;

-- how many resamples: the requested number, else xs_resamples_cap() (2000),
-- fewer on a large run (resamples x clusters at most 40 million, at least 100
-- resamples)
create or replace temp macro xs_resamples_cap() as 2000;

create or replace temp macro xs_resamples(requested, n_clusters) as
    coalesce(
        requested,
        least(xs_resamples_cap(), greatest(100, 40000000 // greatest(n_clusters, 1)))
    )::bigint;

-- the draws of a cluster bootstrap: for each resample b (as many as
-- xs_resamples gives for n_clusters), n_clusters draws of a cluster number
-- k in [0, n_clusters), with replacement. Rows (b, k).
create or replace temp macro xs_cluster_draws(n_clusters, seed) as table
    with resample_hashes as (
        select
            range as b,
            xs_resample_hash(seed, range) as resample_hash,
        from range(coalesce(getvariable('resamples'), xs_resamples_cap()))
        where range < xs_resamples(getvariable('resamples'), n_clusters)
    )
    select
        resample_hashes.b,
        xs_draw(resample_hashes.resample_hash, position.d, n_clusters) as k,
    from resample_hashes
    cross join (select unnest(range(n_clusters)) as d) as position;
