from textkit import word_count


def test_punctuation_is_not_a_word():
    assert word_count("a - b") == 2
    assert word_count("... hello ...") == 1
