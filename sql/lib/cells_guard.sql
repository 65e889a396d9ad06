-- cells_guard.sql: the guard of the analyses that need cells a run may not
-- store (jobs.attribute --cells, recorded in manifest.json as config.cells;
-- runs before the option, and a run without manifest.json (a glob that
-- matches nothing: no row), store every cell). Read first by each of them:
-- `.read sql/lib/cells_guard.sql` (from the repository root).
--
-- cells_guard(runs, accepted, needs, hint): one row, ok = true, when every
-- run of the list `runs` stores cells of a kind in `accepted` ('all',
-- 'same-token', 'none'); else the query stops with
--   <needs>; run <run> stores --cells <kind> (attribute it with --cells <hint>)
-- An analysis keeps its rows `where (select ok from cells_guard(...))`.
create or replace temp macro cells_guard(runs, accepted, needs, hint) as table
    select
        coalesce(bool_and(case
            when list_contains(accepted, coalesce(
                json_extract_string(content, '$.config.cells'), 'all'))
                then true
            else error(needs || '; run '
                       || regexp_replace(filename, '/manifest[.]json$', '')
                       || ' stores --cells '
                       || json_extract_string(content, '$.config.cells')
                       || ' (attribute it with --cells ' || hint || ')')
        end), true) as ok,
    from read_text(list_transform(runs, lambda r: r || '/manifest.jso[n]'));
