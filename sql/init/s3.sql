-- The duckdb CLI over runs on S3 or an S3-compatible store (MinIO, Ceph, R2, ...): loads httpfs and makes an
-- S3 secret from the standard AWS_* environment variables. Not an analysis (those are sql/*.sql): read it first,
--
--   .venv/bin/duckdb -cmd ".read sql/init/s3.sql" -cmd "set variable run = 's3://bucket/prefix/<run id>'" -f sql/table1.sql
--
-- as a -cmd, not as -init: the CLI runs an -init file before the launcher's own -cmd that adds the virtualenv's
-- extension directory, so LOAD would not find httpfs there. httpfs comes from the pip package
-- duckdb-extension-httpfs (DuckDB's signed build for the pinned duckdb-cli), put into that directory by
-- `make setup` (python -m jobs._duckdb_cli): no download, ever. "Extension ... not found" means that step is missing.
-- Variables read (nothing is printed): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; AWS_REGION or
-- AWS_DEFAULT_REGION (default us-east-1); AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (unset: AWS itself; http://...:
-- no TLS; a custom endpoint: path-style URLs). Keys from a profile, SSO or an instance role are not read here:
-- export them first, e.g. eval "$(aws configure export-credentials --format env)".
LOAD httpfs;
.once /dev/null
CREATE OR REPLACE SECRET xsbert_s3 (
    TYPE s3,
    KEY_ID getenv('AWS_ACCESS_KEY_ID'),
    SECRET getenv('AWS_SECRET_ACCESS_KEY'),
    SESSION_TOKEN getenv('AWS_SESSION_TOKEN'),
    REGION coalesce(nullif(getenv('AWS_REGION'), ''), nullif(getenv('AWS_DEFAULT_REGION'), ''), 'us-east-1'),
    ENDPOINT coalesce(
        nullif(regexp_replace(coalesce(nullif(getenv('AWS_ENDPOINT_URL_S3'), ''), getenv('AWS_ENDPOINT_URL')),
                              '^[A-Za-z][A-Za-z0-9+.-]*://|/+$', '', 'g'), ''),
        's3.amazonaws.com'),
    URL_STYLE if(coalesce(nullif(getenv('AWS_ENDPOINT_URL_S3'), ''), getenv('AWS_ENDPOINT_URL')) = '', 'vhost', 'path'),
    USE_SSL not starts_with(lower(coalesce(nullif(getenv('AWS_ENDPOINT_URL_S3'), ''), getenv('AWS_ENDPOINT_URL'))),
                            'http://')
);
