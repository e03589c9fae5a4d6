from draftzoo.eval.lm_quality import repeated_ngram_share


def test_repeated_ngram_share():
    assert repeated_ngram_share([1, 2, 3, 4, 5, 6]) == 0.0
    # a loop of period 2: every 4-gram after the first two repeats
    assert repeated_ngram_share([1, 2] * 5) == 5 / 7
    assert repeated_ngram_share([1, 2, 3]) == 0.0
