"""`dab search` (placeholder module replaced by the scoring-engine work)."""
