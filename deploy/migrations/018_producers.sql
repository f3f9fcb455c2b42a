-- Credentialed producers (gpusched_common.producers): programs that publish JobSubmitted on
-- gpusched.jobs.submitted themselves, the gateway among them. Each holds an Ed25519 private key that only
-- it knows; the store keeps the public key, so reading this table lets no one sign. A producer is bound to
-- the tenants it may submit for ('*': any); `attests` lets it name the principal that submitted (the
-- gateway attests the caller; any other producer is itself the submitter). Revocation is a row update the
-- next submission's verification reads: effective at once.
CREATE TABLE producers (
    producer_id  text PRIMARY KEY CHECK (producer_id ~ '^[0-9a-f]{16}$'),
    name         text NOT NULL UNIQUE,
    tenants      text[] NOT NULL CHECK (cardinality(tenants) > 0),
    attests      boolean NOT NULL DEFAULT false,
    public_key   bytea NOT NULL CHECK (octet_length(public_key) = 32),
    created_at   timestamptz NOT NULL,
    created_by   text NOT NULL,
    revoked_at   timestamptz
);

-- who submitted a job (the principal a producer attests, else the producer) and its name, for the
-- gateway's own-subject rules and name filters
ALTER TABLE jobs ADD COLUMN submitted_by text, ADD COLUMN name text;
CREATE INDEX jobs_tenant_name ON jobs (tenant, name) WHERE name IS NOT NULL;
