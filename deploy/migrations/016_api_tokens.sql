-- API tokens that operators issue for the gateway (gpusched_common.tokens). Only the SHA-256 of a token is
-- kept, never the token. A token of a tenant's role (user, tenant-admin) is bound to one tenant; a
-- cluster-wide one (viewer, operator) to none: the CHECKs hold that rule even for rows written by hand.
-- The role list mirrors gpusched_core.access.principal.Role (tests/integration/test_api_tokens.py).
CREATE TABLE api_tokens (
    token_id      text PRIMARY KEY,
    name          text,
    tenant        text,
    role          text NOT NULL CHECK (role IN ('user', 'tenant-admin', 'viewer', 'operator')),
    token_hash    text NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),
    created_at    timestamptz NOT NULL,
    created_by    text NOT NULL,
    expires_at    timestamptz,
    revoked_at    timestamptz,
    last_used_at  timestamptz,
    CONSTRAINT api_tokens_tenant_role_has_a_tenant CHECK (role NOT IN ('user', 'tenant-admin') OR tenant IS NOT NULL),
    CONSTRAINT api_tokens_cluster_role_has_no_tenant CHECK (role NOT IN ('viewer', 'operator') OR tenant IS NULL),
    CONSTRAINT api_tokens_expire_after_creation CHECK (expires_at IS NULL OR expires_at > created_at)
);
