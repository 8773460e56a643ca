"""Mining passes the query / corpus prompts to sentence-transformers' mine_hard_negatives."""

from __future__ import annotations

import pytest

from st_hardneg.data.mining import mine_training_negatives


def test_prompts_reach_mine_hard_negatives(tiny_model, tiny_sentences, monkeypatch):
    import sentence_transformers.util as st_util

    seen = {}
    real = st_util.mine_hard_negatives

    def spy(*args, **kwargs):
        seen.update({k: kwargs.get(k) for k in ("query_prompt_name", "corpus_prompt_name")})
        return real(*args, **kwargs)

    monkeypatch.setattr(st_util, "mine_hard_negatives", spy)
    tiny_model.prompts = {"query": "query: ", "document": "passage: "}
    pairs = list(zip(tiny_sentences[:4], tiny_sentences[4:8], strict=True))
    mined = mine_training_negatives(tiny_model, pairs, tiny_sentences[8:], relative_margin=None,
                                    query_prompt_name="query", corpus_prompt_name="document")
    assert seen == {"query_prompt_name": "query", "corpus_prompt_name": "document"}
    assert len(mined) == 4
    for anchor, positive, negative in zip(mined["anchor"], mined["positive"], mined["negative"], strict=True):
        assert negative not in (anchor, positive) and negative in tiny_sentences


def test_a_prompt_name_the_model_does_not_define_is_refused(tiny_model, tiny_sentences):
    tiny_model.prompts = {"query": "query: "}
    with pytest.raises(ValueError, match="corpus_prompt_name 'passage' is not a prompt of the model"):
        mine_training_negatives(tiny_model, [("a b", "c d")], tiny_sentences, corpus_prompt_name="passage")


@pytest.fixture
def text_model(tmp_path, tiny_sentences):
    """A tiny random BERT that spells every word of ``tiny_sentences`` (distinct texts, distinct embeddings)."""
    from st_hardneg.models import load_model
    from st_hardneg.testing import make_text_model_dir

    return load_model(make_text_model_dir(tmp_path / "bert", [t.rstrip(".") for t in tiny_sentences]), pooling="mean", max_seq_length=32,
                      device="cpu")


def _cosines(model, anchor, texts):
    import numpy as np

    emb = model.encode([anchor, *texts])
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    return dict(zip(texts, (emb[1:] @ emb[0]).tolist(), strict=True))


def test_known_as_positives_ranks_past_every_known_positive_instead_of_dropping_the_pair(text_model, tiny_sentences):
    anchor, positive, corpus = tiny_sentences[0], tiny_sentences[1], tiny_sentences[2:]
    cosine = _cosines(text_model, anchor, corpus)
    ranked = sorted(corpus, key=cosine.get, reverse=True)
    known = {anchor: {positive, *ranked[:3]}}  # the 3 hardest corpus texts are known relevant
    skipped = mine_training_negatives(text_model, [(anchor, positive)], corpus, known_positives=known,
                                      num_candidates=1, relative_margin=None)
    assert len(skipped) == 0  # the one candidate was known relevant: the pair is dropped
    ranked_past = mine_training_negatives(text_model, [(anchor, positive)], corpus, known_positives=known,
                                          num_candidates=1, relative_margin=None, known_as_positives=True)
    assert ranked_past.to_dict() == {"anchor": [anchor], "positive": [positive], "negative": [ranked[3]]}
    # the hardest text outside the known ones, by the cosines computed here; with 5 candidates the default finds it too
    assert max((t for t in corpus if t not in known[anchor]), key=cosine.get) == ranked[3]
    deep = mine_training_negatives(text_model, [(anchor, positive)], corpus, known_positives=known,
                                   num_candidates=5, relative_margin=None)
    assert deep["negative"] == [ranked[3]]


def test_known_as_positives_takes_a_relative_margin_from_the_lowest_known_positive(text_model, tiny_sentences):
    anchor, positive, corpus = tiny_sentences[0], tiny_sentences[1], tiny_sentences[2:]
    cosine = _cosines(text_model, anchor, [positive, *corpus])
    ranked = sorted(corpus, key=cosine.get, reverse=True)
    known = {anchor: {positive, ranked[6]}}
    mined = mine_training_negatives(text_model, [(anchor, positive)], corpus, known_positives=known,
                                    num_candidates=1, relative_margin=0.01, range_max=len(corpus),
                                    known_as_positives=True)
    lowest = min(cosine[t] for t in known[anchor])
    threshold = lowest - abs(lowest) * 0.01  # mine_hard_negatives' rule with several positives: the lowest one
    expected = [t for t in ranked if t not in known[anchor] and cosine[t] <= threshold]
    assert expected and mined["negative"] == expected[:1]
    own = cosine[positive] - abs(cosine[positive]) * 0.01  # the pair's own positive alone would allow a harder one
    assert [t for t in ranked if t not in known[anchor] and cosine[t] <= own][0] != expected[0]


def test_known_as_positives_refuses_bad_values(text_model, tiny_sentences):
    pairs = [(tiny_sentences[0], tiny_sentences[1])]
    with pytest.raises(ValueError, match="known_as_positives must be True or False, got 'yes'"):
        mine_training_negatives(text_model, pairs, tiny_sentences[2:], known_as_positives="yes")
    with pytest.raises(ValueError, match="none were given"):
        mine_training_negatives(text_model, pairs, tiny_sentences[2:], known_as_positives=True)


def test_known_positives_given_a_string_is_refused_not_read_character_by_character(text_model, tiny_sentences):
    anchor, positive, corpus = tiny_sentences[0], tiny_sentences[1], tiny_sentences[2:]
    ranked = sorted(corpus, key=_cosines(text_model, anchor, corpus).get, reverse=True)
    for bad, message in (({anchor: ranked[0]}, r"is the string .*not a set of texts"),
                         (ranked[0], "known_positives must map anchor texts to sets of texts"),
                         ({anchor: [1, 2]}, r"holds 1 \(int\)")):
        with pytest.raises(TypeError, match=message):
            mine_training_negatives(text_model, [(anchor, positive)], corpus, known_positives=bad,
                                    num_candidates=1, relative_margin=None)
    kept = mine_training_negatives(text_model, [(anchor, positive)], corpus, known_positives={anchor: [ranked[0]]},
                                   num_candidates=3, relative_margin=None)
    assert kept["negative"] == [ranked[1]]  # a list of texts masks the whole text, not its characters
