-- 045_runs_created_brin_dropped: runs_created_brin (021) is redundant beside runs_created_page (032) (issue 23).
-- Every reader of runs by created_at (the submits half of fleet_events_page, the history view's submits read by
-- events_recorded_since, the runs list sorted by creation, scale_measure by queue) is served by
-- runs_created_page or runs_queue_created_page: on a clean table of 200,000 runs the plan with and without the
-- BRIN index reads the same (2,117 against 2,132 buffers). Its insert cost was near nothing, so the drop is
-- for one index fewer to keep and plan around, not for speed (docs/performance.md, "Issue 23, this round").
-- runs_archive keeps its BRIN index: it has no B-tree on created_at.
DROP INDEX IF EXISTS runs_created_brin;
