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
