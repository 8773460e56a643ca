"""The cross-batch queue (``queue_size``): off is exactly the plain loss; a hand-built 3-step sequence matches an
explicit reference (what was enqueued, masked and read); no staging in evaluation or during GradCache's replay;
warm-up, age limit, duplicate masking, checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from st_hardneg import AdversarialNegativesLoss, FocalInfoNCELoss, HNCSELoss, MixCSELoss

TAU, M = 0.05, 0.3


def _unit(x):
    return x / x.norm(dim=1, keepdim=True)


def _focal_rows(anchors, candidates, extra, m=M, exclude_extra=None):
    """Focal-InfoNCE rows written out: positive s², every other candidate s (s + m), over τ."""
    a, c = _unit(anchors), _unit(candidates)
    sim = a @ c.T
    if extra is not None and extra.numel():
        more = a @ _unit(extra).T
        if exclude_extra is not None:
            more = more.masked_fill(exclude_extra, float("nan"))
        sim = torch.cat([sim, more], dim=1)
    rows = []
    for i in range(a.size(0)):
        logits = []
        for j in range(sim.size(1)):
            s = sim[i, j]
            if torch.isnan(s):
                continue
            logits.append(s * s / TAU if j == i else s * (s + m) / TAU)
        logits = torch.stack(logits)
        rows.append(torch.logsumexp(logits, 0) - sim[i, i] * sim[i, i] / TAU)
    return torch.stack(rows)


def _loss(**kwargs):
    model = nn.Linear(4, 4)
    return model, FocalInfoNCELoss(model, m=M, temperature=TAU, **kwargs)


def _step(model):
    """One optimizer step of the loss's model (what commits the staged rows)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model.weight.grad = torch.zeros_like(model.weight)
    optimizer.step()


def _batch(seed, n=3, d=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)]


# --------------------------------------------------------------------------- off = the plain loss
@pytest.mark.parametrize("make", [
    lambda model, **kw: FocalInfoNCELoss(model, **kw),
    lambda model, **kw: MixCSELoss(model, seed=0, **kw),
    lambda model, **kw: HNCSELoss(model, seed=0, **kw),
    lambda model, **kw: AdversarialNegativesLoss(model, untied=False, num_adversaries=0, **kw),
])
def test_empty_or_warming_queue_is_the_plain_loss(make):
    model = nn.Linear(4, 4)
    plain, queued = make(model), make(model, queue_size=8, queue_warmup_steps=2)
    for step in range(3):
        embeddings = _batch(step, n=4)
        expected = plain.compute_loss_from_embeddings(embeddings, None)
        got = queued.compute_loss_from_embeddings(embeddings, None)
        if step < 2:  # empty, then filled but warming up: exactly the plain loss
            assert torch.equal(got, expected)
        else:  # two steps done: the queue is read
            assert got.item() != pytest.approx(expected.item(), abs=1e-6)
            assert queued.diagnostics["queue_rows_read"] == 8.0
        _step(model)


def test_queue_size_zero_has_no_queue():
    _, loss = _loss()
    assert loss.queue is None and "queue_size" not in loss.get_config_dict()


# --------------------------------------------------------------------------- the reference sequence
def test_three_steps_match_an_explicit_reference():
    model, loss = _loss(queue_size=4)
    batches = [_batch(s) for s in range(3)]
    # step 0: nothing queued yet
    got = loss.compute_loss_from_embeddings(batches[0], None)
    torch.testing.assert_close(got, _focal_rows(*batches[0], None).mean(), rtol=1e-6, atol=1e-6)
    _step(model)
    assert loss.queue.filled == 3
    torch.testing.assert_close(loss.queue.vectors[:3], _unit(batches[0][1]))
    # step 1: the 3 positives of step 0 are extra negatives
    got = loss.compute_loss_from_embeddings(batches[1], None)
    torch.testing.assert_close(got, _focal_rows(*batches[1], batches[0][1]).mean(), rtol=1e-6, atol=1e-6)
    _step(model)
    # step 2: a ring of 4 holds step 1's 3 positives and the last of step 0's
    assert loss.queue.filled == 4 and loss.queue.pointer == 2
    kept = torch.cat([batches[0][1][2:], batches[1][1]])
    got = loss.compute_loss_from_embeddings(batches[2], None)
    torch.testing.assert_close(got, _focal_rows(*batches[2], kept).mean(), rtol=1e-6, atol=1e-6)
    assert loss.diagnostics["queue_rows_read"] == 4.0 and loss.diagnostics["queue_filled"] == 4.0


def test_queue_rows_carry_no_gradient():
    model, loss = _loss(queue_size=8)
    first = [e.clone().requires_grad_() for e in _batch(0)]
    loss.compute_loss_from_embeddings(first, None)
    _step(model)
    second = [e.clone().requires_grad_() for e in _batch(1)]
    loss.compute_loss_from_embeddings(second, None).backward()
    assert first[0].grad is None and first[1].grad is None  # the queued step-0 rows are detached
    assert second[0].grad is not None


def test_several_forwards_before_one_step_are_all_enqueued():
    model, loss = _loss(queue_size=16)
    for s in range(2):  # gradient accumulation: two micro-batches, one optimizer step
        loss.compute_loss_from_embeddings(_batch(s), None)
    assert loss.queue.filled == 0  # nothing enters before the step
    _step(model)
    assert loss.queue.filled == 6
    torch.testing.assert_close(loss.queue.vectors[:6], _unit(torch.cat([_batch(0)[1], _batch(1)[1]])))


def test_evaluation_forwards_stage_nothing():
    model, loss = _loss(queue_size=8)
    with torch.no_grad():
        loss.compute_loss_from_embeddings(_batch(0), None)
    _step(model)
    assert loss.queue.filled == 0


def test_a_step_of_another_model_commits_nothing():
    model, loss = _loss(queue_size=8)
    loss.compute_loss_from_embeddings(_batch(0), None)
    _step(nn.Linear(4, 4))
    assert loss.queue.filled == 0
    _step(model)
    assert loss.queue.filled == 3


def test_max_age_skips_old_rows():
    model, loss = _loss(queue_size=32, queue_max_age=1)
    loss.compute_loss_from_embeddings(_batch(0), None)
    _step(model)
    loss.compute_loss_from_embeddings(_batch(1), None)
    _step(model)
    got = loss.compute_loss_from_embeddings(_batch(2), None)  # step 0's rows are 2 steps old: skipped
    torch.testing.assert_close(got, _focal_rows(*_batch(2), _batch(1)[1]).mean(), rtol=1e-6, atol=1e-6)


def test_a_queued_duplicate_of_the_anchor_text_is_masked():
    model, loss = _loss(queue_size=8)
    keys0 = torch.tensor([[10, 11, 12], [10, 11, 12]])  # (columns, N): anchor and positive texts
    loss.set_false_negative_inputs(text_keys=keys0)
    loss.compute_loss_from_embeddings(_batch(0), None)
    _step(model)
    keys1 = torch.tensor([[11, 20, 21], [11, 20, 21]])  # row 0 repeats step 0's second text
    loss.set_false_negative_inputs(text_keys=keys1)
    got = loss.compute_loss_from_embeddings(_batch(1), None)
    exclude = torch.zeros(3, 3, dtype=torch.bool)
    exclude[0, 1] = True
    torch.testing.assert_close(got, _focal_rows(*_batch(1), _batch(0)[1], exclude_extra=exclude).mean(),
                               rtol=1e-6, atol=1e-6)
    assert loss.diagnostics["queue_rows_masked"] == pytest.approx(1 / 3)


def test_margin_masks_queue_rows_too():
    model, loss = _loss(queue_size=8, margin=0.0)
    loss.compute_loss_from_embeddings(_batch(0), None)
    _step(model)
    anchors, positives = _batch(1)
    got = loss.compute_loss_from_embeddings([anchors, positives], None)
    a, p, q = _unit(anchors), _unit(positives), _unit(_batch(0)[1])
    exclude_queue = (a @ q.T) > (a * p).sum(1, keepdim=True)
    # the in-batch candidates above the positive are masked as well (the same rule)
    sim = a @ p.T
    in_batch = sim > sim.diagonal().unsqueeze(1)
    in_batch.fill_diagonal_(False)
    rows = []
    for i in range(3):
        logits = [sim[i, i] ** 2 / TAU]
        logits += [sim[i, j] * (sim[i, j] + M) / TAU for j in range(3) if j != i and not in_batch[i, j]]
        s = a[i] @ q.T
        logits += [s[j] * (s[j] + M) / TAU for j in range(3) if not exclude_queue[i, j]]
        rows.append(torch.logsumexp(torch.stack(logits), 0) - sim[i, i] ** 2 / TAU)
    torch.testing.assert_close(got, torch.stack(rows).mean(), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- real model: GradCache, checkpoints
def _features(model, texts):
    return model.tokenize(texts)


@pytest.mark.parametrize("source", [{}, {"queue_source": "ema", "queue_momentum": 0.9}], ids=["online", "ema"])
def test_cached_equals_uncached_and_the_replay_stages_nothing(tiny_model, tiny_sentences, source):
    # float64: the cached loss sums its rows chunk by chunk, in another order than the uncached one; in float32 the
    # tiny random model amplifies that rounding to 1e-3 in its parameters after three SGD steps
    plain_model = tiny_model.double()
    cached_model = copy.deepcopy(tiny_model)
    plain = FocalInfoNCELoss(plain_model, queue_size=32, **source)
    cached = FocalInfoNCELoss(cached_model, queue_size=32, mini_batch_size=3, **source)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain_model, cached_model)]
    for step in range(3):
        texts = tiny_sentences[step * 5: step * 5 + 5]
        losses = []
        for loss, model, opt in zip((plain, cached), (plain_model, cached_model), opts, strict=True):
            torch.manual_seed(step)  # the same dropout masks
            opt.zero_grad()
            value = loss([_features(model, texts), _features(model, texts)], None)
            value.backward()
            opt.step()
            losses.append(value.item())
        assert losses[0] == pytest.approx(losses[1], abs=1e-5)
        assert plain.queue.filled == cached.queue.filled == 5 * (step + 1)  # once per step, not per replay
    torch.testing.assert_close(plain.queue.vectors, cached.queue.vectors, atol=1e-5, rtol=0)


def test_checkpoint_round_trip_is_bit_exact():
    from st_hardneg.losses.stateful import attach_to_optimizer

    model, loss = _loss(queue_size=5, queue_max_age=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    attach_to_optimizer(loss.queue, optimizer)
    for s in range(3):
        loss.compute_loss_from_embeddings(_batch(s), None)
        model.weight.grad = torch.zeros_like(model.weight)
        optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())

    model2 = nn.Linear(4, 4)
    model2.load_state_dict(model.state_dict())
    loss2 = FocalInfoNCELoss(model2, m=M, temperature=TAU, queue_size=5, queue_max_age=7)
    optimizer2 = torch.optim.SGD(model2.parameters(), lr=0.0)
    attach_to_optimizer(loss2.queue, optimizer2)
    optimizer2.load_state_dict(saved)
    q1, q2 = loss.queue, loss2.queue
    assert torch.equal(q1.vectors, q2.vectors) and torch.equal(q1.keys, q2.keys)
    assert torch.equal(q1.produced_at, q2.produced_at)
    assert (q1.pointer, q1.filled, q1.step_clock.steps) == (q2.pointer, q2.filled, q2.step_clock.steps) == (4, 5, 3)
    batch = _batch(9)
    assert torch.equal(loss.compute_loss_from_embeddings(batch, None), loss2.compute_loss_from_embeddings(batch, None))


def test_checkpoint_can_leave_the_rows_out(caplog):
    model, loss = _loss(queue_size=5, queue_checkpoint=False)
    loss.compute_loss_from_embeddings(_batch(0), None)
    _step(model)
    state = loss.queue.training_state_dict()
    assert state == {"steps": 1, "saved": False}
    _, fresh = _loss(queue_size=5, queue_checkpoint=False)
    fresh.queue.load_training_state_dict(state)
    assert fresh.queue.step_clock.steps == 1 and fresh.queue.filled == 0 and "refills from empty" in caplog.text


@pytest.mark.parametrize("kwargs, error, message", [
    ({"queue_size": -1}, ValueError, "queue_size"),
    ({"queue_size": 2.5}, (ValueError, TypeError), "queue_size"),
    ({"queue_size": 4, "queue_warmup_steps": -1}, ValueError, "queue_warmup_steps"),
    ({"queue_size": 4, "queue_max_age": 0}, ValueError, "queue_max_age"),
    ({"queue_size": 4, "queue_checkpoint": "yes"}, (ValueError, TypeError), "queue_checkpoint"),
])
def test_queue_arguments_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        FocalInfoNCELoss(nn.Linear(4, 4), **kwargs)


def test_queue_needs_a_model_and_no_guide(tiny_model):
    with pytest.raises(ValueError, match="queue_size needs the model"):
        FocalInfoNCELoss(None, queue_size=4)
    with pytest.raises(ValueError, match="queue_size with a guide is not supported"):
        FocalInfoNCELoss(tiny_model, copy.deepcopy(tiny_model), queue_size=4)


def test_config_lists_the_queue():
    _, loss = _loss(queue_size=64, queue_warmup_steps=3)
    config = loss.get_config_dict()
    assert (config["queue_size"], config["queue_warmup_steps"], config["queue_max_age"]) == (64, 3, None)


def test_focal_rows_helper_matches_the_plain_loss():
    """The reference used above is the plain loss when there is no extra row (so it can fail)."""
    _, loss = _loss()
    batch = _batch(4)
    torch.testing.assert_close(loss.compute_loss_from_embeddings(batch, None), _focal_rows(*batch, None).mean(),
                               rtol=1e-6, atol=1e-6)
    assert not torch.allclose(_focal_rows(*batch, None).mean(), _focal_rows(*batch, batch[0]).mean())
    F.normalize(batch[0])  # (torch's normalisation agrees with _unit; kept for the reader)


def test_trainer_resume_restores_the_queue_and_the_next_losses(tiny_model_dir, tiny_sentences, tmp_path):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments

    from st_hardneg.models import load_model
    from st_hardneg.training.callbacks import StatefulLossCallback

    sentences = [s if i < 16 else f"{s[:-1]} again." for i, s in enumerate((tiny_sentences * 2)[:32])]

    def run(resume_from=None):
        model = load_model(tiny_model_dir, pooling="cls", max_seq_length=32, device="cpu")
        loss = FocalInfoNCELoss(model, queue_size=12)
        losses = []
        loss.register_forward_hook(lambda module, args, output: losses.append(float(output.detach())))
        args = SentenceTransformerTrainingArguments(
            output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, learning_rate=1e-3, report_to=[], seed=0,
            max_steps=4, save_strategy="steps", save_steps=2, disable_tqdm=True)
        dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss,
                                             callbacks=[StatefulLossCallback(loss)])
        trainer.train(resume_from_checkpoint=resume_from)
        return loss, losses

    loss_a, losses_a = run()
    loss_b, losses_b = run(resume_from=str(tmp_path / "run" / "checkpoint-2"))
    assert len(losses_a) == 4 and len(losses_b) == 2
    assert losses_b == pytest.approx(losses_a[2:], rel=1e-6, abs=1e-7)  # step 3 reads the restored queue
    assert loss_b.queue.filled == loss_a.queue.filled == 12 and loss_b.queue.step_clock.steps == 4
    torch.testing.assert_close(loss_b.queue.vectors, loss_a.queue.vectors)
    assert torch.equal(loss_b.queue.keys, loss_a.queue.keys)


def test_mnrl_queue_is_mnrl_without_a_queue_and_queues_with_one(tiny_model):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from st_hardneg.training import build_loss

    embeddings = _batch(3, n=5, d=32)
    reference = MultipleNegativesRankingLoss(tiny_model).compute_loss_from_embeddings(embeddings, None)
    plain = build_loss("mnrl_queue", tiny_model)
    torch.testing.assert_close(plain.compute_loss_from_embeddings(embeddings, None), reference, rtol=1e-6, atol=1e-6)
    queued = build_loss("mnrl_queue", tiny_model, queue_size=16)
    assert queued.queue is not None and queued.queue.size == 16


@pytest.mark.integration
def test_two_processes_equal_one_and_share_one_queue(tmp_path):
    from st_hardneg.testing.distributed import queued_steps, spawn

    batches = [_batch(10 + s, n=4, d=6) for s in range(3)]
    single = queued_steps(0, 1, batches, queue_size=10, gather=False)
    ranks = spawn(queued_steps, (batches, 10), tmp_path)
    for step in range(3):  # the mean of the processes' losses is the single-process loss, queue read included
        assert sum(r["losses"][step] for r in ranks) / 2 == pytest.approx(single["losses"][step], abs=1e-5)
    assert ranks[0]["filled"] == ranks[1]["filled"] == single["filled"] == 10
    torch.testing.assert_close(ranks[0]["vectors"], single["vectors"])
    torch.testing.assert_close(ranks[1]["vectors"], single["vectors"])


# --------------------------------------------------------------------------- queue_source="ema"
def _key_rows(encoder, texts):
    """What a key encoder (dropout off) makes of ``texts``: unit rows, computed here without the loss."""
    encoder = copy.deepcopy(encoder).eval()
    with torch.no_grad():
        return _unit(encoder(_features(encoder, texts))["sentence_embedding"].float())


def test_ema_queue_holds_the_key_encoders_rows_and_the_encoder_follows_the_ema(tiny_model, tiny_sentences):
    """Step 1 queues a dropout-off copy of the model as built; step 2 the copy moved by θ_k ← m·θ_k + (1 - m)·θ."""
    m = 0.5
    start = copy.deepcopy(tiny_model)  # the weights the key encoder is copied from
    loss = FocalInfoNCELoss(tiny_model, queue_size=32, queue_source="ema", queue_momentum=m)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.5)
    tiny_model.train()
    batches = [(tiny_sentences[0:4], tiny_sentences[4:8]), (tiny_sentences[8:12], tiny_sentences[12:16])]
    expected_encoder = copy.deepcopy(start)
    for step, (anchors, positives) in enumerate(batches):
        expected_rows = _key_rows(expected_encoder, positives)  # the key encoder before this step's update
        optimizer.zero_grad()
        loss([_features(tiny_model, anchors), _features(tiny_model, positives)], None).backward()
        optimizer.step()
        torch.testing.assert_close(loss.queue.vectors[4 * step: 4 * step + 4], expected_rows, atol=1e-6, rtol=0)
        online = dict(tiny_model.named_parameters())
        with torch.no_grad():
            for name, param in expected_encoder.named_parameters():
                param.mul_(m).add_(online[name].detach(), alpha=1 - m)
        for (name, got), want in zip(loss.queue.key_encoder.named_parameters(), expected_encoder.parameters(),
                                     strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=name)
    # the online model's own (dropout-on, stepped) positives differ from what was queued: the source matters
    with torch.no_grad():
        online_rows = _unit(tiny_model(_features(tiny_model, batches[1][1]))["sentence_embedding"])
    assert not torch.allclose(online_rows, loss.queue.vectors[4:8], atol=1e-4)
    assert not loss.queue.key_encoder.training and loss.queue.filled == 8
    assert loss.diagnostics["queue_key_encoder_bytes"] == sum(p.numel() * 4 for p in tiny_model.parameters()) + sum(
        b.numel() * b.element_size() for b in tiny_model.buffers())


def test_ema_queue_round_trips_its_key_encoder(tiny_model, tiny_sentences):
    loss = FocalInfoNCELoss(tiny_model, queue_size=8, queue_source="ema", queue_momentum=0.5)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.5)
    loss([_features(tiny_model, tiny_sentences[:4]), _features(tiny_model, tiny_sentences[4:8])], None).backward()
    optimizer.step()
    state = copy.deepcopy(loss.queue.training_state_dict())
    other_model = copy.deepcopy(tiny_model)
    fresh = FocalInfoNCELoss(other_model, queue_size=8, queue_source="ema", queue_momentum=0.5)
    assert not all(torch.equal(a, b) for a, b in zip(fresh.queue.key_encoder.parameters(),
                                                     loss.queue.key_encoder.parameters(), strict=True))
    fresh.queue.load_training_state_dict(state)
    for a, b in zip(fresh.queue.key_encoder.state_dict().values(), loss.queue.key_encoder.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)
    plain = FocalInfoNCELoss(copy.deepcopy(tiny_model), queue_size=8)
    with pytest.raises(ValueError, match="has no key encoder"):
        fresh.queue.load_training_state_dict({k: v for k, v in state.items() if k != "key_encoder"})
    assert plain.queue.key_encoder is None


def test_ema_queue_needs_the_features(tiny_model):
    loss = FocalInfoNCELoss(tiny_model, queue_size=8, queue_source="ema")
    with pytest.raises(ValueError, match="needs forward"):
        loss.compute_loss_from_embeddings(_batch(0, n=4, d=32), None)
    with torch.no_grad():  # evaluation queues nothing, so it needs nothing
        loss.compute_loss_from_embeddings(_batch(0, n=4, d=32), None)


@pytest.mark.parametrize("kwargs, message", [
    ({"queue_size": 4, "queue_source": "momentum"}, "queue_source"),
    ({"queue_source": "ema"}, "without a queue"),
    ({"queue_momentum": 0.9}, "without a queue"),
    ({"queue_size": 4, "queue_source": "ema", "queue_momentum": 1.5}, "queue_momentum"),
])
def test_queue_source_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FocalInfoNCELoss(nn.Linear(4, 4), **kwargs)


def test_adcse_ema_queue_uses_its_own_key_encoder_untied_and_a_queue_encoder_tied(tiny_model):
    untied = AdversarialNegativesLoss(tiny_model, num_adversaries=0, queue_size=8, queue_source="ema")
    assert untied.queue.key_encoder is None and untied.key_encoder is not None  # the loss's own feeds the queue
    with pytest.raises(ValueError, match="queue_momentum does not apply"):
        AdversarialNegativesLoss(tiny_model, num_adversaries=0, queue_size=8, queue_source="ema", queue_momentum=0.9)
    tied = AdversarialNegativesLoss(tiny_model, untied=False, num_adversaries=0, queue_size=8, queue_source="ema",
                                    queue_momentum=0.9)
    assert tied.key_encoder is None and tied.queue.key_encoder is not None and tied.queue.momentum == 0.9
    assert tied.get_config_dict()["queue_source"] == "ema" and tied.get_config_dict()["queue_momentum"] == 0.9


@pytest.mark.integration
def test_ema_queue_two_processes_equal_one(tmp_path, tiny_model_dir, tiny_sentences):
    """With gather_across_devices (and GradCache) every process queues the key encoder's rows of the global batch,
    in the order of one process, and the key encoders stay identical."""
    from st_hardneg.testing.distributed import ema_queued_model_steps, spawn

    steps = [[tiny_sentences[0:8], tiny_sentences[8:16]], [tiny_sentences[8:16], tiny_sentences[0:8]]]
    single = ema_queued_model_steps(0, 1, str(tiny_model_dir), steps, 32)
    ranks = spawn(ema_queued_model_steps, (str(tiny_model_dir), steps, 32, 2), tmp_path)
    for step in range(2):
        assert sum(r["losses"][step] for r in ranks) / 2 == pytest.approx(single["losses"][step], rel=1e-5)
    assert single["filled"] == ranks[0]["filled"] == ranks[1]["filled"] == 16
    for r in ranks:
        torch.testing.assert_close(r["vectors"], single["vectors"], atol=1e-6, rtol=0)
        torch.testing.assert_close(r["key_param"], single["key_param"], atol=1e-9, rtol=0)


# --------------------------------------------------------------------------- queue_anchors: the second bank
SYMMETRIC_FOCAL = {"directions": ("query_to_doc", "doc_to_query"), "partition_mode": "per_direction"}


def _symmetric_reference(batch, queued_positives=None, queued_anchors=None, exclude_anchors=None):
    """Per-direction Focal-InfoNCE written out: the mean of each pair's query_to_doc row (against the positives and
    the queued positives) and its doc_to_query row (the positive against the anchors and the queued anchors)."""
    anchors, positives = batch
    q2d = _focal_rows(anchors, positives, queued_positives)
    d2q = _focal_rows(positives, anchors, queued_anchors, exclude_extra=exclude_anchors)
    return ((q2d + d2q) / 2).mean()


def test_queue_anchors_join_the_doc_to_query_denominator():
    model = nn.Linear(4, 4)
    loss = FocalInfoNCELoss(model, m=M, temperature=TAU, queue_size=8, queue_anchors=True, **SYMMETRIC_FOCAL)
    only_positives = FocalInfoNCELoss(model, m=M, temperature=TAU, queue_size=8, **SYMMETRIC_FOCAL)
    batches = [_batch(s) for s in range(3)]
    torch.testing.assert_close(loss.compute_loss_from_embeddings(batches[0], None), _symmetric_reference(batches[0]),
                               rtol=1e-6, atol=1e-6)
    only_positives.compute_loss_from_embeddings(batches[0], None)
    _step(model)
    assert loss.anchor_queue.filled == loss.queue.filled == 3
    torch.testing.assert_close(loss.anchor_queue.vectors[:3], _unit(batches[0][0]))
    got = loss.compute_loss_from_embeddings(batches[1], None)
    torch.testing.assert_close(got, _symmetric_reference(batches[1], batches[0][1], batches[0][0]),
                               rtol=1e-6, atol=1e-6)
    # without the anchors' bank doc_to_query reads the batch only: a different (and checkable) number
    without = only_positives.compute_loss_from_embeddings(batches[1], None)
    torch.testing.assert_close(without, _symmetric_reference(batches[1], batches[0][1], None), rtol=1e-6, atol=1e-6)
    assert abs(float(got) - float(without)) > 1e-4
    assert loss.diagnostics["anchor_queue_rows_read"] == 3.0 and loss.diagnostics["anchor_queue_filled"] == 3.0


def test_a_queued_anchor_with_the_positives_text_is_masked():
    model = nn.Linear(4, 4)
    loss = FocalInfoNCELoss(model, m=M, temperature=TAU, queue_size=8, queue_anchors=True, **SYMMETRIC_FOCAL)
    batches = [_batch(s) for s in range(2)]
    loss.set_false_negative_inputs(text_keys=torch.tensor([[11, 12, 13], [21, 22, 23]]))
    loss.compute_loss_from_embeddings(batches[0], None)
    _step(model)
    # step 1: pair 0's positive has the text of queued anchor 1 (key 12), pair 2's anchor that of queued anchor 2
    loss.set_false_negative_inputs(text_keys=torch.tensor([[31, 32, 13], [12, 42, 43]]))
    got = loss.compute_loss_from_embeddings(batches[1], None)
    exclude = torch.zeros(3, 3, dtype=torch.bool)
    exclude[0, 1] = exclude[2, 2] = True  # (the queued positives' keys 21, 22, 23 match nothing: q2d unmasked)
    expected = _symmetric_reference(batches[1], batches[0][1], batches[0][0], exclude_anchors=exclude)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    unmasked = _symmetric_reference(batches[1], batches[0][1], batches[0][0])
    assert abs(float(expected) - float(unmasked)) > 1e-4  # the masking is visible in the number


def test_ema_queue_anchors_are_the_key_encoders_anchors(tiny_model, tiny_sentences):
    start = copy.deepcopy(tiny_model)
    loss = FocalInfoNCELoss(tiny_model, queue_size=8, queue_source="ema", queue_anchors=True, **SYMMETRIC_FOCAL)
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.5)
    anchors, positives = tiny_sentences[:4], tiny_sentences[4:8]
    loss([_features(tiny_model, anchors), _features(tiny_model, positives)], None).backward()
    optimizer.step()
    torch.testing.assert_close(loss.anchor_queue.vectors[:4], _key_rows(start, anchors), atol=1e-6, rtol=0)
    torch.testing.assert_close(loss.queue.vectors[:4], _key_rows(start, positives), atol=1e-6, rtol=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"queue_anchors": True}, "without a queue"),
    ({"queue_size": 4, "queue_anchors": True}, "doc_to_query"),
    ({"queue_size": 4, "queue_anchors": "yes", **SYMMETRIC_FOCAL}, "queue_anchors"),
])
def test_queue_anchors_arguments_are_checked(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        FocalInfoNCELoss(nn.Linear(4, 4), **kwargs)


# --------------------------------------------------------------------------- queue_as_pool
def _mixcse_rows(anchors, positives, queued, partner_rows, lam=0.2, tau=0.05):
    """MixCSE rows written out: InfoNCE over the in-batch positives, the queued rows and the mixed negative
    normalize(λ p_i + (1 - λ) partner_i)."""
    a, p, q = _unit(anchors), _unit(positives), _unit(queued)
    mixed = _unit(lam * p + (1 - lam) * _unit(partner_rows))
    logits = torch.cat([a @ p.T, a @ q.T, (a * mixed).sum(1, keepdim=True)], dim=1) / tau
    return torch.logsumexp(logits, dim=1) - (a * p).sum(1) / tau


def test_queue_as_pool_lets_the_hardest_partner_come_from_the_queue():
    model = nn.Linear(4, 4)
    pooled = MixCSELoss(model, partner="hardest", queue_size=8, queue_as_pool=True)
    plain = MixCSELoss(model, partner="hardest", queue_size=8)
    first = _batch(0)
    pooled.compute_loss_from_embeddings(first, None)
    plain.compute_loss_from_embeddings(first, None)
    _step(model)
    anchors, positives = _batch(1)
    queued = first[1]
    # make queued row 2 the hardest negative of anchor 0 (closer than every in-batch positive but its own)
    queued = queued.clone()
    queued[2] = _unit(anchors[0:1])[0] * 3 + 0.01
    pooled.queue.vectors[2] = _unit(queued[2:3])[0]
    plain.queue.vectors[2] = _unit(queued[2:3])[0]
    a, p, q = _unit(anchors), _unit(positives), _unit(queued)
    in_batch = (a @ p.T).fill_diagonal_(float("-inf"))
    batch_best, batch_idx = in_batch.max(dim=1)
    queue_best, queue_idx = (a @ q.T).max(dim=1)
    partner_rows = torch.where((queue_best > batch_best).unsqueeze(1), q[queue_idx], p[batch_idx])
    assert bool((queue_best > batch_best)[0])  # the constructed case: row 0 takes the queued row
    got = pooled.compute_loss_from_embeddings([anchors, positives], None)
    torch.testing.assert_close(got, _mixcse_rows(anchors, positives, queued, partner_rows).mean(), rtol=1e-5,
                               atol=1e-6)
    expected_share = float((queue_best > batch_best).float().mean())
    assert pooled.diagnostics["queue_partner_fraction"] == pytest.approx(expected_share)
    # the default keeps the batch's partners: another, checkable number
    got_plain = plain.compute_loss_from_embeddings([anchors, positives], None)
    torch.testing.assert_close(got_plain, _mixcse_rows(anchors, positives, queued, p[batch_idx]).mean(), rtol=1e-5,
                               atol=1e-6)
    assert abs(float(got) - float(got_plain)) > 1e-4


@pytest.mark.parametrize("make, message", [
    (lambda m: FocalInfoNCELoss(m, queue_size=4, queue_as_pool=True), "makes no such choice.*Only MixCSELoss"),
    (lambda m: HNCSELoss(m, queue_size=4, queue_as_pool=True), "top-k pool are chosen from the batch only"),
    (lambda m: AdversarialNegativesLoss(m, untied=False, queue_size=4, queue_as_pool=True), "learned vectors"),
    (lambda m: MixCSELoss(m, queue_size=4, queue_as_pool=True), "needs partner='hardest'"),
    (lambda m: MixCSELoss(m, partner="hardest", queue_as_pool=True), "without a queue"),
    (lambda m: MixCSELoss(m, partner="hardest", queue_size=4, queue_as_pool="yes"), "queue_as_pool"),
])
def test_queue_as_pool_is_refused_where_there_is_no_hardest_choice(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make(nn.Linear(4, 4))
