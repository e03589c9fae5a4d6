"""A third model-free proposer built from its own file and one registry line, nothing else.

`repeat_last.py` drafts the context's last token again, k times (right on runs of one token,
cheap to verify anywhere); registering `repeat_last.MODEL_FREE_SPEC` is its one registry line.
tests/inference/test_proposal_settings.py serves it through `draftzoo generate`, measures it
with `draftzoo eval` and ranks its report on a leaderboard through the house's shared code.
"""
