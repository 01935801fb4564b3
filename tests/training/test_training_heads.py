"""Training EAGLE/Medusa heads and a distilled draft on a tiny random Llama: saved names and shapes match
what TensorRT-LLM's converters read, runs are deterministic for a seed, resumable, and bad input fails
clearly."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specpipe import heads_format
from specpipe.errors import CompatibilityError, SpecpipeError
from specpipe.training.config import TrainConfig
from specpipe.training.features import Features, extract_features
from specpipe.training.prompts import read_user_data
from specpipe.training.train import train

HIDDEN, VOCAB, INTER, HEADS, KV, HEAD_DIM = 32, 96, 64, 4, 2, 8


def tiny_target(seed=0, hidden=HIDDEN, vocab=VOCAB):
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=INTER,
        num_hidden_layers=3,
        num_attention_heads=HEADS,
        num_key_value_heads=KV,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def features(target):
    g = torch.Generator().manual_seed(1)
    sequences = [(torch.randint(3, VOCAB, (40,), generator=g).tolist(), 10 if i % 2 else 40) for i in range(24)]
    return extract_features(target, sequences)


def test_features_are_the_targets_hidden_states_and_greedy_labels(target, features):
    assert len(features) == 24 * 40
    assert features.hidden.dtype == torch.float16 and features.hidden.shape == (960, HIDDEN)
    ids = features.tokens[:40][None]
    with torch.no_grad():
        h = target.model(input_ids=ids).last_hidden_state[0]
        best = target.lm_head(h).argmax(-1)
    assert torch.equal(features.labels[:40], best)
    assert torch.allclose(features.hidden[:40].float(), h, atol=1e-2)
    assert features.seq_end[:40].tolist() == [40] * 40
    # Sequence 1 has its answer from position 10 on, sequence 0 is plain text.
    assert features.is_answer[40:50].sum() == 0 and features.is_answer[50:80].all()


def test_sequences_of_other_lengths_share_a_right_padded_forward(target):
    """A batch pads to its longest sequence; each sequence's features are those of its forward alone."""
    g = torch.Generator().manual_seed(2)
    sequences = [(torch.randint(3, VOCAB, (n,), generator=g).tolist(), n // 2) for n in (7, 19, 12, 30)]
    batched = extract_features(target, sequences, batch_tokens=4 * 30, capture_layers=(0, 2))
    alone = extract_features(target, sequences, batch_tokens=1, capture_layers=(0, 2))
    assert len(batched) == len(alone) == 7 + 19 + 12 + 30
    assert torch.equal(batched.tokens, alone.tokens) and torch.equal(batched.seq_end, alone.seq_end)
    assert torch.equal(batched.labels, alone.labels)
    assert torch.allclose(batched.hidden.float(), alone.hidden.float(), atol=2e-3)
    assert torch.allclose(batched.fused.float(), alone.fused.float(), atol=2e-3)
    assert batched.is_answer.tolist() == alone.is_answer.tolist()


def run(target, features, tmp_path, method, steps=3, progress=None, **kw):
    cfg = TrainConfig.defaults_for(
        method,
        max_steps=steps,
        seed=7,
        batch=4,
        window=8,
        draft_vocab_size=48,
        checkpoint_seconds=kw.pop("checkpoint_seconds", 60),
        **kw,
    )
    return train(target, features, cfg, tmp_path / method, end_ids=(2,), progress=progress)


def test_medusa_tensors_match_the_converter_layout(target, features, tmp_path):
    result = run(target, features, tmp_path, "medusa")
    assert result.steps == 3
    vocab = result.tensors.pop("draft_vocab")
    assert vocab.shape == (48,) and 2 in vocab.tolist() and torch.equal(vocab, vocab.sort().values)
    assert {k: tuple(v.shape) for k, v in result.tensors.items()} == {
        k: s for k, s in heads_format.expected_medusa_tensors(HIDDEN, VOCAB, 3, 1).items() if ".linear." in k
    }
    out = heads_format.write_medusa_layout(tmp_path / "layout", result.tensors, target, 3, 1)
    from safetensors.torch import load_file

    saved = load_file(out / "medusa_lm_head.safetensors")
    assert {k: tuple(v.shape) for k, v in saved.items()} == heads_format.expected_medusa_tensors(HIDDEN, VOCAB, 3, 1)
    assert all(v.dtype == torch.float16 for v in saved.values())
    assert torch.equal(saved["1.1.weight"], target.lm_head.weight.detach().half())
    config = json.loads((out / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"]) == (3, 1)
    m = result.metrics
    assert len(m["top1"]) == 3 and all(0 <= a <= 1 for a in m["top1"]) and m["chain_tokens_per_forward"] >= 1


def test_eagle_tensors_match_the_converter_layout(target, features, tmp_path):
    result = run(target, features, tmp_path, "eagle")
    result.tensors.pop("draft_vocab")
    expected = heads_format.expected_eagle_tensors(HIDDEN, INTER, HEADS, KV, HEAD_DIM, VOCAB)
    assert {k: tuple(v.shape) for k, v in result.tensors.items()} == {
        k: s for k, s in expected.items() if k != "embed_tokens.weight"
    }
    out = heads_format.write_eagle_layout(tmp_path / "layout", result.tensors, target)
    saved = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert {k: tuple(v.shape) for k, v in saved.items()} == expected
    assert torch.equal(saved["embed_tokens.weight"], target.model.embed_tokens.weight.detach().half())
    # The converter reads the folder's config with LlamaConfig.from_pretrained.
    config = LlamaConfig.from_pretrained(out)
    assert (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads) == (1, HIDDEN, KV)
    assert len(result.metrics["top1_by_depth"]) == 3


def test_draft_model_keeps_embeddings_and_trains_layers(target, features, tmp_path):
    result = run(target, features, tmp_path, "draft-model", draft_layers=2)
    names = set(result.tensors)
    assert "model.norm.weight" in names and "model.layers.1.mlp.down_proj.weight" in names
    assert not any(n.startswith(("model.layers.2", "model.embed_tokens", "lm_head")) for n in names)
    assert 0 <= result.metrics["top1"] <= 1
    assert result.meta["num_layers"] == 2


@pytest.mark.parametrize("method", ["medusa", "eagle", "draft-model"])
def test_same_seed_same_weights_and_resume_matches(target, features, tmp_path, method):
    extra = {"draft_layers": 2} if method == "draft-model" else {}
    a = run(target, features, tmp_path / "a", method, steps=4, **extra)
    b = run(target, features, tmp_path / "b", method, steps=4, **extra)
    for k in a.tensors:
        assert torch.equal(a.tensors[k], b.tensors[k]), k

    def stop_after_two(step, total, info):
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(target, features, tmp_path / "c", method, steps=4, checkpoint_seconds=0, progress=stop_after_two, **extra)
    resumed = run(target, features, tmp_path / "c", method, steps=4, **extra)
    assert resumed.steps == 4
    for k in a.tensors:
        assert torch.equal(a.tensors[k], resumed.tensors[k]), k


def test_compact_file_round_trip_and_target_check(target, tmp_path):
    tensors = {"0.0.linear.weight": torch.randn(HIDDEN, HIDDEN), "draft_vocab": torch.arange(5)}
    path = heads_format.save_compact(
        tmp_path, "medusa", tensors, {"hidden_size": HIDDEN, "vocab_size": VOCAB, "num_heads": 1}
    )
    loaded, meta = heads_format.load_compact(path, "medusa")
    assert loaded["0.0.linear.weight"].dtype == torch.float16 and loaded["draft_vocab"].dtype == torch.int64
    assert meta["num_heads"] == 1
    heads_format.check_for_target(meta, target.config, path)
    other = tiny_target(hidden=48).config
    with pytest.raises(
        CompatibilityError, match="hidden size 32 and vocabulary 96, but this target has hidden size 48"
    ):
        heads_format.check_for_target(meta, other, path)


def test_corrupt_or_foreign_files_are_refused(tmp_path):
    bad = tmp_path / "medusa_heads.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(SpecpipeError, match="corrupt or truncated"):
        heads_format.load_compact(bad, "medusa")
    path = heads_format.save_compact(tmp_path / "e", "eagle", {"fc.bias": torch.zeros(4)}, {})
    with pytest.raises(SpecpipeError, match="not a specpipe medusa file"):
        heads_format.load_compact(path, "medusa")
    with pytest.raises(SpecpipeError, match="are missing"):
        heads_format.load_compact(tmp_path / "none.safetensors", "eagle")


def test_bad_training_input(target, features, tmp_path):
    with pytest.raises(SpecpipeError, match="--budget must be a positive"):
        TrainConfig(method="medusa", budget_minutes=0)
    with pytest.raises(SpecpipeError, match="unknown method"):
        TrainConfig(method="lookahead")
    empty = Features(
        *(torch.zeros(0, dtype=torch.long) for _ in range(2)),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=torch.bool),
    )
    with pytest.raises(SpecpipeError, match="training data is empty"):
        train(target, empty, TrainConfig(method="medusa", max_steps=1), tmp_path)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(SpecpipeError, match="is empty"):
        read_user_data(tmp_path / "empty.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "hi"}\n{"text": 3}\n')
    with pytest.raises(SpecpipeError, match="bad.jsonl line 2 has neither"):
        read_user_data(tmp_path / "bad.jsonl")
    (tmp_path / "torn.jsonl").write_text('{"prompt": "hi"}\n{"prompt": \n')
    with pytest.raises(SpecpipeError, match="torn.jsonl line 2 is not valid JSON"):
        read_user_data(tmp_path / "torn.jsonl")
    (tmp_path / "texts").mkdir()
    with pytest.raises(SpecpipeError, match="is empty"):
        read_user_data(tmp_path / "texts")
    (tmp_path / "good.jsonl").write_text('{"prompt": "Say hi"}\n\n{"messages": [{"role": "user", "content": "Hi"}]}\n')
    prompts, texts = read_user_data(tmp_path / "good.jsonl")
    assert [p.text for p in prompts] == ["Say hi", '[{"role": "user", "content": "Hi"}]'] and texts == []


def test_cli_refuses_bad_input_before_writing(tmp_path):
    from click.testing import CliRunner

    from specpipe.cli import main

    out = tmp_path / "out"
    (tmp_path / "empty.jsonl").write_text("")
    cases = [
        (["--budget", "0"], 2, "must be a positive number of minutes"),
        (["--data", str(tmp_path / "empty.jsonl")], 1, "is empty"),
        (["--data", str(tmp_path / "missing.jsonl")], 1, "does not exist"),
        (["--max-steps", "0"], 2, "must be a positive integer"),
        (["--num-prompts", "0", "--stdlib-tokens", "0"], 1, "the training corpus would be empty"),
        (["--self-instruct", "-1"], 2, "'--self-instruct': -1 is not in the range"),
    ]
    for args, code, message in cases:
        result = CliRunner().invoke(
            main, ["train-draft", "--target", "smollm2-135m", "--method", "medusa", "--out", str(out), *args]
        )
        assert result.exit_code == code, result.output
        assert message in result.output and "Traceback" not in result.output
        assert not out.exists()
    result = CliRunner().invoke(
        main, ["train-draft", "--target", "smollm2-13m", "--method", "eagle", "--out", str(out)]
    )
    assert result.exit_code == 1 and "did you mean 'smollm2-135m'" in result.output and not out.exists()


def test_unrolled_eagle_training_sees_what_the_drafter_computes(target, features):
    """Step d of the unrolled training pass at root position t equals the run-time drafter's depth-d
    feature for the chain that follows the same tokens (same inputs, positions and attention)."""
    from specpipe.runtime.cpu.drafters.draft_vocab import ReducedLMHead
    from specpipe.runtime.cpu.drafters.eagle import EagleTreeDrafter
    from specpipe.training.tasks import EagleTask, unrolled_attention_mask
    from specpipe.tree import Tree

    mask = unrolled_attention_mask(4, 3)[0, 0]
    assert mask.shape == (4, 12)
    assert mask[:, :4].tolist() == torch.ones(4, 4, dtype=torch.bool).tril().tolist()
    assert torch.equal(mask[:, 4:8], torch.eye(4, dtype=torch.bool)) and torch.equal(
        mask[:, 8:], torch.eye(4, dtype=torch.bool)
    )

    cfg = TrainConfig.defaults_for("eagle", max_steps=1, seed=3, batch=1, window=6, draft_vocab_size=0)
    task = EagleTask(target, features, cfg, None, torch.arange(VOCAB))
    with torch.no_grad():  # sharp attention, so that positions and masks matter
        g = torch.Generator().manual_seed(5)
        for name, p in task.module.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (1.0 if "q_proj" in name or "k_proj" in name else 0.05))
    task.module.eval()
    start, t = 0, 5  # window positions 0..5; compare at the last root position t
    with torch.no_grad():
        unrolled = {d: pred[0, t].clone() for d, pred, _ in task._unroll(features, torch.tensor([start]), 3)}
    tokens = features.tokens[: t + 4].tolist()
    drafter = EagleTreeDrafter(task.module, task.embed, ReducedLMHead(target.lm_head.weight), Tree.parse([[0]]))
    drafter.reset(tokens[: t + 2])
    drafter.commit(tokens[: t + 2], features.hidden[: t + 1].float())
    drafter._advance(tokens[: t + 2])
    torch.testing.assert_close(drafter._f_last, unrolled[1], rtol=1e-4, atol=1e-4)
    n = t + 1  # position of the newest token x_{t+1}
    out2, dk, dv = drafter._expand(
        drafter._f_last[None], torch.tensor([tokens[t + 2]]), torch.tensor([n]), None, None, [[]]
    )
    torch.testing.assert_close(out2[0], unrolled[2], rtol=1e-4, atol=1e-4)
    out3, _, _ = drafter._expand(out2, torch.tensor([tokens[t + 3]]), torch.tensor([n + 1]), dk, dv, [[0]])
    torch.testing.assert_close(out3[0], unrolled[3], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(unrolled[2], unrolled[3])
