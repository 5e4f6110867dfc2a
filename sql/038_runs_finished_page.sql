-- 038_runs_finished_page: the runs list sorted by finish time pages by (finished_at, id) with an index
-- (issue 24). runs_finished held only finished runs and finished_at alone: a sort by finish time read every
-- match (0.5-0.7 s a page at 1,000,000 runs). runs_finished_page holds every run, unfinished ones under
-- NULL, in (finished_at, id) order: api_runs_page_finished reads its finished part and its NULL part as two
-- index ranges, in either order. Retention's finished_at < cutoff reads it as it read runs_finished.
-- runs_dead (finished_at) duplicated the leading column of runs_dead_page (032) under the same predicate.
CREATE INDEX runs_finished_page ON runs (finished_at, id);
DROP INDEX runs_finished;
DROP INDEX runs_dead;
