-- 004_workflows: DAG workflows. A workflow is a set of runs sharing runs.workflow_id;
-- each node has a local name, and edges say which runs wait for which.

CREATE TABLE workflows (
    id          uuid PRIMARY KEY,
    name        text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The run that currently stands for each node name. A recompute of a subgraph makes new
-- runs for its nodes; the old rows stay (current = false) as history.
CREATE TABLE workflow_nodes (
    run_id       bigint PRIMARY KEY REFERENCES runs (id),
    workflow_id  uuid NOT NULL REFERENCES workflows (id),
    name         text NOT NULL,
    current      boolean NOT NULL DEFAULT true
);
CREATE UNIQUE INDEX workflow_nodes_current ON workflow_nodes (workflow_id, name) WHERE current;

CREATE TABLE workflow_edges (
    run_id      bigint NOT NULL REFERENCES runs (id),   -- the dependent
    depends_on  bigint NOT NULL REFERENCES runs (id),   -- its upstream
    PRIMARY KEY (run_id, depends_on)
);
-- Release and cancel walk edges from the upstream side.
CREATE INDEX workflow_edges_upstream ON workflow_edges (depends_on);
