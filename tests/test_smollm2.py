"""Exactness on the embedded SmolLM2-135M-Instruct: logits and greedy generation."""
import pytest
import torch

from kvedge.common.model.generate import greedy_answer
from kvedge.common.model.verify import verify_runtime

pytestmark = pytest.mark.smollm

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "The special magic number is 4829105. Remember it. What is the special magic number?",
    "List three primary colors.",
]


def test_verify_passes_on_smollm2(smollm2_rt):
    checks = verify_runtime(smollm2_rt, n_tokens=96)
    assert all(c.ok for c in checks), [(c.name, c.max_abs_diff) for c in checks]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_generation_matches_model_generate(smollm2, smollm2_rt, prompt):
    tok = smollm2.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, return_dict=False)
    n_new = 16
    with torch.no_grad():
        # an explicit mask: generate() would otherwise mask <|im_end|>, SmolLM2's pad token
        theirs = smollm2.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                        max_new_tokens=n_new, do_sample=False, eos_token_id=None,
                                        pad_token_id=tok.pad_token_id)
    ours = greedy_answer(smollm2_rt, ids, max_new_tokens=n_new)
    assert ours == theirs[0, len(ids):].tolist()
