-- 031_token_lineage: a token made through the API records the token that made it (issue 24
-- item 2). Its role, scope and lifetime never exceed its parent's (checked at creation), and a
-- token whose parent, or any ancestor, is revoked or expired stops working (checked at every
-- authentication through the chain of parent_id).
ALTER TABLE api_tokens ADD COLUMN parent_id bigint REFERENCES api_tokens (id);
CREATE INDEX api_tokens_parent ON api_tokens (parent_id) WHERE parent_id IS NOT NULL;
