from draftzoo.eval.lm_quality import repeated_ngram_share


def test_repeated_ngram_share():
    assert repeated_ngram_share([1, 2, 3, 4, 5, 6]) == 0.0
    # a loop of period 2: every 4-gram after the first two repeats
    assert repeated_ngram_share([1, 2] * 5) == 5 / 7
    assert repeated_ngram_share([1, 2, 3]) == 0.0


def test_reference_share_of_a_periodic_stream():
    import numpy as np

    from draftzoo.eval.lm_quality import reference_share

    looping = np.tile(np.arange(3), 100)
    assert abs(reference_share(looping, window=30, count=5) - 24 / 27) < 1e-12
    assert reference_share(np.arange(300), window=30, count=5) == 0.0
