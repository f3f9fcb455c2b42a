-- Unauthenticated messages create no stream and no row beyond a counter (issue 14): failed
-- authentications are counted per kind and credential (an unknown or missing credential is one key,
-- however many forgeries name one), with the latest reason; the per-failure table goes.
CREATE TABLE admission_auth_failure_counts (
    kind         text NOT NULL,
    credential   text NOT NULL,
    failures     bigint NOT NULL,
    first_at     timestamptz NOT NULL,
    last_at      timestamptz NOT NULL,
    last_reason  text NOT NULL,
    PRIMARY KEY (kind, credential)
);
INSERT INTO admission_auth_failure_counts (kind, credential, failures, first_at, last_at, last_reason)
SELECT left(reason, 200), coalesce(left(key_id, 64), '-'), count(*), min(at), max(at), left(max(reason), 500)
FROM admission_auth_failures GROUP BY 1, 2;
DROP TABLE admission_auth_failures;
