"""The LogitsProcessorAdapter inside a real transformers ``generate`` (a tiny GPT-2 built from a config)."""

from __future__ import annotations

import numpy as np
import pytest

from caliber_core.serving.responses import LogitsProcessorAdapter, token_ids_bytes
from caliber_core.serving.runtime import Perturber

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

KEY = b"adapter test key, not a secret"
PAD = 0
PROMPT = [5, 6, 7, 8]


class Recorder(transformers.LogitsProcessor):
    """Keeps a copy of the scores it sees at each step."""

    def __init__(self):
        self.steps = []

    def __call__(self, input_ids, scores):
        self.steps.append(scores.detach().clone())
        return scores


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     bos_token_id=1, eos_token_id=1, pad_token_id=PAD)
    return transformers.GPT2LMHeadModel(config).eval()


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def generate(model, prompts, row, make_adapter):
    """The shared prompt's scores at each step: clean (before the adapter) and served (after)."""
    ids, mask = left_padded(prompts)
    before, after = Recorder(), Recorder()
    adapter = make_adapter(mask)
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=PAD,
                       logits_processor=transformers.LogitsProcessorList([before, adapter, after]))
    return [s[row] for s in before.steps], [s[row] for s in after.steps]


BATCHES = ([PROMPT, [9, 10]], 0), ([[11, 12, 13, 14, 15, 16], PROMPT], 1), ([[20, 21], [22], PROMPT], 2)


@pytest.mark.parametrize("how", ["pad_token_id", "attention_mask"])
def test_the_same_prompt_gets_the_same_noise_in_any_padded_batch(model, how):
    torch.set_num_threads(1)
    perturber = Perturber(2.0, key=KEY)

    def make_adapter(mask):
        if how == "pad_token_id":
            return LogitsProcessorAdapter(perturber, pad_token_id=PAD)
        return LogitsProcessorAdapter(perturber, attention_mask=mask)

    runs = [generate(model, prompts, row, make_adapter) for prompts, row in BATCHES]
    (clean0, served0), others = runs[0], runs[1:]
    for clean, served in others:
        for step, (c0, s0, c, s) in enumerate(zip(clean0, served0, clean, served)):
            # The model's own scores for the prompt barely depend on the padding ...
            assert torch.allclose(c, c0, atol=1e-5), step
            # ... and its noise is the same draw: the served scores are the clean ones plus one noise.
            noise0, noise = (s0.double() - c0.double()), (s.double() - c.double())
            assert torch.allclose(noise, noise0, atol=1e-5), step
            if torch.equal(c, c0):
                assert torch.equal(s, s0), step
    # The served scores are the Perturber's, for the unpadded prefix.
    prefix = np.array(PROMPT, dtype=np.int64)
    assert torch.equal(served0[0], perturber.perturb(clean0[0][None], [token_ids_bytes(prefix)])[0])
    assert not torch.allclose(served0[0], clean0[0], atol=0.1)


def test_without_unpadding_a_padded_prompt_gets_fresh_noise(model):
    # What the adapter fixes: with no pad id or mask, the padding is part of the id.
    perturber = Perturber(2.0, key=KEY)
    plain = lambda mask: LogitsProcessorAdapter(perturber)  # noqa: E731
    clean0, served0 = generate(model, *BATCHES[0], plain)
    clean1, served1 = generate(model, *BATCHES[1], plain)
    noise0, noise1 = served0[0].double() - clean0[0].double(), served1[0].double() - clean1[0].double()
    assert not torch.allclose(noise0, noise1, atol=0.5)


def test_adapter_argument_errors():
    p = Perturber(1.0, key=KEY)
    with pytest.raises(ValueError, match="give pad_token_id or attention_mask, not both"):
        LogitsProcessorAdapter(p, pad_token_id=0, attention_mask=torch.ones(1, 2))
    with pytest.raises(TypeError, match="pad_token_id must be an integer token id or None, got 'x'"):
        LogitsProcessorAdapter(p, pad_token_id="x")
    adapter = LogitsProcessorAdapter(p, attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 3\) does not cover input_ids of shape \(4, 3\)"):
        adapter(torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, 10))
