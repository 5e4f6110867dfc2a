-- 037_history_cursor_indexes: the fleet history (events_since, GET /v1/events and `fencepost events`) pages
-- by cursor newest first, each half of the view `history` limited on its own (issue 24). The attempts'
-- claims and finishes had only BRIN indexes on their times (020, 035), so each page sorted every attempt
-- of the window: 1.4 s of a 2 s page at 750,000 attempts in the last hour. These serve both halves in the
-- page's order, the cursor's row comparison as their index condition (a page: about 2 ms). Each costs a
-- B-tree insert per attempt row the recorder writes (at the right edge: attempts come in about time order);
-- a finish written after its claim is an update that inserts into both.
CREATE INDEX attempts_claim_page ON attempts (started_at DESC, claim_stream_id DESC) WHERE claim_version IS NOT NULL;
CREATE INDEX attempts_finish_page ON attempts (finished_at DESC, finish_stream_id DESC) WHERE finish_type IS NOT NULL;
