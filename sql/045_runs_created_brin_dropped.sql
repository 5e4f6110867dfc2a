-- 045_runs_created_brin_dropped: runs_created_brin (021) is redundant beside runs_created_page (032), and
-- misleads the planner (issue 23). Every reader of runs by created_at (the submits half of events_since, the
-- history view's submits read by events_recorded_since, the runs list sorted by creation, scale_measure by
-- queue) reads runs_created_page or runs_queue_created_page. With both present the planner took the BRIN
-- index for events_recorded_since over an hour (9,259 buffers, 55 ms at 200,000 runs) where the B-tree reads
-- 4,105 (36 ms); nothing else chose it (docs/performance.md, "Issue 23, this round"). runs_archive keeps its
-- BRIN index: it has no B-tree on created_at.
DROP INDEX IF EXISTS runs_created_brin;
