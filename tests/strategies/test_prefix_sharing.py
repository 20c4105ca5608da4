"""Planning the shared openings of a batch: which prefixes, in which order."""

from roll.strategies.prefix_sharing import common_length, shared_openings


def test_a_rollouts_first_turn_shares_the_demonstrations_then_each_groups_board():
    demos = list(range(100, 140))  # shared by every episode
    board_a, board_b = [1, 2, 3, 4, 5], [1, 2, 9, 9, 9]  # one board per group (they share the first two tokens)
    prompts = [demos + board_a] * 3 + [demos + board_b] * 2 + [[7] * 50]
    levels = shared_openings(prompts, min_tokens=8)
    assert levels == [[tuple(demos + [1, 2])], [tuple(demos + board_a), tuple(demos + board_b)]]
    assert shared_openings(prompts, min_tokens=100) == []  # nothing that long is shared
    assert shared_openings([demos], min_tokens=8) == []  # a lone prompt shares nothing


def test_later_turns_share_only_what_they_still_have_in_common():
    opening = list(range(64))
    turns = [opening + [1, 5, 6], opening + [2, 7], opening + [3]]
    assert shared_openings(turns, min_tokens=32) == [[tuple(opening)]]
    assert common_length([1, 2, 3], [1, 2]) == 2 and common_length([], [1]) == 0
