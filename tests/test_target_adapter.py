import pytest
import torch

from draftzoo.architectures.target import (
    FingerprintMismatchError,
    TargetAdapter,
    TargetError,
    TargetFingerprint,
)
from tests.conftest import tiny_causal_lm
from tests.tiny_architectures import ARCHITECTURES, tiny_model


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen3"])
def test_hooked_hidden_states_equal_output_hidden_states(kind):
    model = tiny_causal_lm(kind)
    adapter = TargetAdapter(model)
    input_ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    indices = list(range(adapter.num_layers + 1))
    out = adapter(input_ids, hidden_indices=indices)
    reference = model(input_ids=input_ids, output_hidden_states=True)
    assert len(reference.hidden_states) == adapter.num_layers + 1
    assert sorted(out.hidden_states) == indices
    for index in indices:
        torch.testing.assert_close(
            out.hidden_states[index], reference.hidden_states[index], rtol=1e-5, atol=1e-6
        )
    torch.testing.assert_close(out.logits, reference.logits)
    # index N is the final post-norm state: the lm_head of it gives the logits
    torch.testing.assert_close(adapter.lm_head(out.hidden_states[adapter.num_layers]), out.logits)


def test_capture_keeps_only_requested_layers_and_removes_hooks():
    adapter = TargetAdapter(tiny_causal_lm("llama"))
    out = adapter(torch.tensor([[1, 2, 3]]), hidden_indices=[1])
    assert list(out.hidden_states) == [1]
    assert all(not layer._forward_pre_hooks for layer in adapter.decoder_layers)
    assert not adapter.final_norm._forward_hooks


def test_bad_layer_index_is_a_clear_error():
    adapter = TargetAdapter(tiny_causal_lm("llama"))
    with pytest.raises(TargetError, match=r"valid HF indices are 0\.\.3"):
        adapter(torch.tensor([[1, 2]]), hidden_indices=[4])


def test_model_without_causal_lm_head_is_refused():
    from transformers import LlamaConfig, LlamaModel

    base = LlamaModel(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    )
    with pytest.raises(TargetError, match="no causal-LM head"):
        TargetAdapter(base)


def test_from_pretrained_refuses_a_model_type_without_lm_head(tmp_path):
    from transformers import DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=32, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    DistilBertModel(config).save_pretrained(tmp_path)
    with pytest.raises(TargetError, match="'distilbert' has no causal-LM head"):
        TargetAdapter.from_pretrained(tmp_path)


def test_fingerprint_roundtrip_and_mismatch_names_both_sides():
    llama = TargetAdapter(tiny_causal_lm("llama")).fingerprint()
    qwen = TargetAdapter(tiny_causal_lm("qwen3", vocab_size=100)).fingerprint()
    assert llama == TargetFingerprint.from_dict(llama.to_dict())
    assert llama.architecture == "LlamaForCausalLM"
    assert (llama.hidden_size, llama.num_layers, llama.vocab_size) == (32, 3, 96)
    llama.require_match(llama)
    with pytest.raises(FingerprintMismatchError) as err:
        llama.require_match(qwen)
    message = str(err.value)
    assert "LlamaForCausalLM != Qwen3ForCausalLM" in message
    assert "vocab_size: 96 != 100" in message


def test_forward_returns_the_cache_it_filled():
    adapter = TargetAdapter(tiny_causal_lm("llama"))
    out = adapter(torch.tensor([[1, 2, 3, 4]]), use_cache=True)
    assert out.cache is not None and out.cache.get_seq_length() == 4
    assert adapter(torch.tensor([[1, 2]]), use_cache=False).cache is None


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_teacher_logits_are_the_targets_own(kind):
    """The logits teachers read from the final state equal the model's: Gemma's soft-capping
    and Granite's scaling included."""
    from draftzoo.data.capture import target_logits

    model = tiny_model(kind, 96)
    adapter = TargetAdapter(model)
    input_ids = torch.randint(3, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    out = adapter(input_ids, hidden_indices=[adapter.num_layers])
    final = out.hidden_states[adapter.num_layers]
    torch.testing.assert_close(target_logits(adapter, final), out.logits, rtol=1e-5, atol=1e-5)
    if kind == "granite":  # the head's output alone is not the model's
        assert not torch.allclose(adapter.lm_head(final), out.logits, atol=1e-3)
    if kind == "gemma2":  # capped at 30, however large the head's output
        assert target_logits(adapter, final * 1e3).abs().max() <= 30.0
