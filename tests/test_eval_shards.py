from nbtools.ranks import gather_order, padding_marks, split_shards

# What accelerate's prepared DataLoader gave 2 and 3 ranks for 10 samples, batch 4 (measured on CPU).
TWO = [[[0, 1, 2, 3], [8, 9, 0, 1]], [[4, 5, 6, 7], [2, 3, 4, 5]]]
THREE = [[[0, 1, 2, 3]], [[4, 5, 6, 7]], [[8, 9, 0, 1]]]
ONE = [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]]


def test_gather_order_is_step_major_rank_minor():
    assert gather_order(TWO) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
    assert gather_order(THREE) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert gather_order(ONE) == list(range(10))
    assert gather_order([]) == []


def test_padding_is_what_lies_past_n_in_the_gathered_order():
    assert padding_marks(TWO, 10) == [
        [[False] * 4, [False, False, True, True]],
        [[False] * 4, [True] * 4],
    ]
    assert padding_marks(ONE, 10) == [[[False] * 4, [False] * 4, [False] * 2]]


def test_split_shards_real_parts_disjoint_and_padding_counted():
    s = split_shards(TWO, 10)
    assert s.real == [[0, 1, 2, 3, 8, 9], [4, 5, 6, 7]]
    assert s.padding == [[0, 1], [2, 3, 4, 5]]
    assert sorted(s.all_real) == list(range(10)) and len(s.all_padding) == 6
    assert s.overlaps() == {}
    s3 = split_shards(THREE, 10)
    assert s3.real == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and s3.padding == [[], [], [0, 1]]


def test_overlapping_shards_are_reported():
    # Two ranks that each evaluated the whole set (no sharding): every sample counted twice.
    both = [[[0, 1, 2, 3]], [[0, 1, 2, 3]]]
    s = split_shards(both, 8)
    assert s.overlaps() == {(0, 1): {0, 1, 2, 3}}
    assert s.all_padding == []
