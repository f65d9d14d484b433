"""CaliberLogitsProcessor (V1) and CaliberLogitsProcessorV2 without an engine: hand-built batch updates and contexts.

vLLM is not imported (the classes fall back to a plain base); the real engine
is checked in test_vllm_engine.py, in vLLM's own virtualenv.
"""

from __future__ import annotations

import json
from enum import Enum
from types import SimpleNamespace

import numpy as np
import pytest
from throttle_support import KEY, write_policy

from caliber_core import Perturber
from caliber_core.serving import vllm as caliber_vllm
from caliber_core.serving.vllm import (CaliberLogitsProcessor, CaliberLogitsProcessorV2, CaliberSetupError,
                                       position_id)
from caliber_core.throttle import Throttle, load_policy

torch = pytest.importorskip("torch")

K = 24


class Move(Enum):  # vLLM's MoveDirectionality, by name
    UNIDIRECTIONAL = 1
    SWAP = 2


@pytest.fixture
def setup(tmp_path, monkeypatch):
    policy_path = write_policy(tmp_path, levels=(0, 1, 2), n_classes=K, escalate_after=10**6)
    key_path = tmp_path / "caliber.key"
    key_path.write_text(KEY.hex() + "\n")
    key_path.chmod(0o600)
    key_path.chmod(0o600)  # a key readable by others is refused
    monkeypatch.setenv("CALIBER_POLICY", str(policy_path))
    monkeypatch.setenv("CALIBER_KEY_FILE", str(key_path))
    policy = load_policy(policy_path)
    throttle = Throttle(policy, key=KEY, store=f"sqlite:///{tmp_path / 'ledger.db'}", metrics=False)
    for level in (1, 2, 3):
        throttle.flag(f"acct-{level}", level=level)
    config = json.loads((tmp_path / "cfg.json").read_text())
    return SimpleNamespace(policy=policy, throttle=throttle, config=config, tmp_path=tmp_path)


def vllm_config(mode="processed_logprobs", vocab=K):
    return SimpleNamespace(model_config=SimpleNamespace(logprobs_mode=mode, get_vocab_size=lambda: vocab))


def params(setup, level):
    return SimpleNamespace(extra_args={"caliber": setup.throttle.grant(f"acct-{level}" if level else "clean",
                                                                       rows=5)})


def update(added=(), removed=(), moved=(), batch_size=0):
    return SimpleNamespace(added=list(added), removed=list(removed), moved=list(moved), batch_size=batch_size)


def expected_row(setup, logits_row, level, prompt, output):
    if level == 0:
        return logits_row
    target = setup.policy.levels[level].target
    return Perturber.from_config(setup.config, target=target, key=KEY).perturb(
        logits_row[None, :], [position_id(prompt, output)])[0]


def check_batch(setup, processor, logits, requests):
    """requests: row -> (level, prompt, output) or None; compares apply() with each row's Perturber."""
    served = processor.apply(logits.clone())
    for row, request in enumerate(requests):
        level, prompt, output = request
        want = expected_row(setup, logits[row], level, prompt, output)
        assert torch.equal(served[row], want), f"row {row} (level {level})"
    return served


def test_rows_follow_adds_removes_moves_and_swaps(setup):
    p = CaliberLogitsProcessor(vllm_config(), torch.device("cpu"), False)
    assert p.is_argmax_invariant() is False
    gen = torch.Generator().manual_seed(0)
    prompts = {name: [1, 5 + i, 9] for i, name in enumerate("abcde")}
    outputs = {name: [] for name in prompts}
    levels = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 2}
    layout = ["a", "b", "c", "d"]
    p.update_state(update(added=[(i, params(setup, levels[n]), prompts[n], outputs[n]) for i, n in enumerate(layout)]))

    def step():
        logits = torch.randn(len(layout), K, generator=gen)
        check_batch(setup, p, logits, [(levels[n], prompts[n], list(outputs[n])) for n in layout])
        for n in layout:  # the engine appends to its live lists; the processor reads them in apply()
            outputs[n].append(int(torch.randint(4, K, (1,), generator=gen)))

    step()
    step()
    p.update_state(None)  # no change in the batch
    step()
    # "b" leaves; condense moves the last row into its slot (one way)
    p.update_state(update(removed=[1], moved=[(3, 1, Move.UNIDIRECTIONAL)]))
    layout = ["a", "d", "c"]
    step()
    # a swap
    p.update_state(update(moved=[(0, 2, Move.SWAP)]))
    layout = ["c", "d", "a"]
    step()
    # "e" is added into a freed slot while "c" leaves it, listed in both removed and added (either order works)
    p.update_state(update(removed=[0], added=[(0, params(setup, levels["e"]), prompts["e"], outputs["e"])]))
    layout = ["e", "d", "a"]
    step()
    step()


def test_an_add_is_an_overwrite_in_either_order(setup):
    """vLLM's docstring says removed, added, moved; its own helper applies adds first. Both end the same."""
    gen = torch.Generator().manual_seed(1)
    old, new = params(setup, 3), params(setup, 0)
    results = []
    for first_update, second_update in (
            (update(removed=[0]), update(added=[(0, new, [1, 2], [])])),   # removed, then added
            (update(added=[(0, new, [1, 2], [])]), update(removed=[])),    # added over a stale slot
            (update(removed=[0], added=[(0, new, [1, 2], [])]), None)):    # both in one update
        p = CaliberLogitsProcessor(vllm_config(), torch.device("cpu"), False)
        p.update_state(update(added=[(0, old, [7, 7], [])]))
        p.update_state(first_update)
        p.update_state(second_update)
        logits = torch.randn(1, K, generator=gen)
        results.append(torch.equal(p.apply(logits.clone()), logits))
    assert results == [True, True, True]


def test_every_row_costs_the_same_draws(setup, monkeypatch):
    from caliber_core.serving import keyed_noise_torch

    made = []
    real = keyed_noise_torch.add_keyed_noise
    monkeypatch.setattr(keyed_noise_torch, "add_keyed_noise",
                        lambda block, seeds, inc, served=None, **kw: (made.append(block.shape[0] * len(seeds)),
                                                                      real(block, seeds, inc, served=served, **kw))[1])
    counts = []
    for level in (0, 1, 3):
        p = CaliberLogitsProcessor(vllm_config(), torch.device("cpu"), False)
        p.update_state(update(added=[(i, params(setup, level), [1, i], []) for i in range(3)]))
        made.clear()
        p.apply(torch.zeros(3, K))
        counts.append(sum(made))
    assert counts == [9, 9, 9]  # 3 rows x 3 ladder draws at every level


def test_a_row_never_added_is_served_at_the_top_level(setup):
    p = CaliberLogitsProcessor(vllm_config(), torch.device("cpu"), False)
    logits = torch.zeros(2, K)
    out = p.apply(logits)
    assert float(out.std()) > 1.0  # the top level's sigma is 2


def test_the_processor_refuses_to_start_without_processed_logprobs(setup, monkeypatch):
    for mode in ("raw_logprobs", "raw_logits"):
        with pytest.raises(CaliberSetupError, match=rf"needs --logprobs-mode processed_logprobs \(or processed_logits\), "
                                                    rf"got '{mode}'"):
            CaliberLogitsProcessor(vllm_config(mode), None, False)
        with pytest.raises(CaliberSetupError, match=r"needs --logprobs-mode processed_logprobs"):
            CaliberLogitsProcessorV2(vllm_config(mode), None)
    CaliberLogitsProcessor(vllm_config("processed_logits"), None, False)
    with pytest.raises(CaliberSetupError, match=r"the model's vocabulary has 30 tokens, but the policy's config was "
                                                r"calibrated for n_classes=24"):
        CaliberLogitsProcessor(vllm_config(vocab=30), None, False)


def test_missing_or_broken_settings_refuse_to_start(setup, monkeypatch, tmp_path):
    monkeypatch.delenv("CALIBER_KEY_FILE")
    with pytest.raises(CaliberSetupError, match=r"^CALIBER_KEY_FILE is not set: the Caliber logits processor needs"):
        CaliberLogitsProcessor(vllm_config(), None, False)
    monkeypatch.setenv("CALIBER_KEY_FILE", str(tmp_path / "absent.key"))
    with pytest.raises(CaliberSetupError, match=r"CALIBER_KEY_FILE=.*absent\.key: cannot read the key \(No such file"):
        CaliberLogitsProcessor(vllm_config(), None, False)
    monkeypatch.setenv("CALIBER_POLICY", str(tmp_path / "absent.json"))
    with pytest.raises(CaliberSetupError, match=r"CALIBER_POLICY=.*absent\.json: .*cannot read policy"):
        CaliberLogitsProcessor(vllm_config(), None, False)


def test_validate_params_refuses_requests_that_did_not_come_through_the_throttle(setup):
    for processor in (CaliberLogitsProcessor, CaliberLogitsProcessorV2):
        processor.validate_params(params(setup, 2))
        with pytest.raises(ValueError, match=r"^request has no caliber grant token"):
            processor.validate_params(SimpleNamespace(extra_args=None))
        with pytest.raises(ValueError, match=r"^request has no caliber grant token"):
            processor.validate_params(SimpleNamespace(extra_args={"level": 0}))
        token = params(setup, 3).extra_args["caliber"]
        with pytest.raises(ValueError, match=r"signature does not verify"):
            processor.validate_params(SimpleNamespace(extra_args={"caliber": token[:-4] + "AAAA"}))
        with pytest.raises(ValueError, match=r"is malformed"):
            processor.validate_params(SimpleNamespace(extra_args={"caliber": "level-0"}))


def test_a_request_that_waited_past_its_expiry_is_served_its_level(setup):
    """Expiry is checked at admission; a request queued longer still gets the level it was granted."""
    clock = [1_000_000.0]
    t = Throttle(setup.policy, key=KEY, store=f"sqlite:///{setup.tmp_path / 'old.db'}", metrics=False,
                 clock=lambda: clock[0])
    t.flag("x", level=3)
    old = SimpleNamespace(extra_args={"caliber": t.grant("x", rows=1, valid_minutes=1)})
    with pytest.raises(ValueError, match=r"expired"):
        CaliberLogitsProcessor.validate_params(old)
    p = CaliberLogitsProcessor(vllm_config(), None, False)
    p.update_state(update(added=[(0, old, [1, 2], [])]))
    assert p.slots[0].level == 3
    forged = SimpleNamespace(extra_args={"caliber": "caliber-grant.v1.e30.AAAA"})
    p.update_state(update(added=[(1, forged, [1, 2], [])]))
    assert p.slots[1].level == 3  # a token that never verified: the top level, not clean


# ---------------------------------------------------------------------------------------------- V2

class ReqStates:
    """The runner's per-slot token history, as LogitsProcRequestState exposes it (``.gpu`` tensors)."""

    def __init__(self, max_reqs=4, max_len=32):
        self.all_token_ids = SimpleNamespace(gpu=torch.zeros(max_reqs, max_len, dtype=torch.int64))
        self.total_len = SimpleNamespace(gpu=torch.zeros(max_reqs, dtype=torch.int32))

    def fill(self, slot, tokens):
        self.all_token_ids.gpu[slot, :len(tokens)] = torch.tensor(tokens)
        self.total_len.gpu[slot] = len(tokens)


def ctx(slots, positions, input_ids):
    return SimpleNamespace(expanded_idx_mapping=torch.tensor(slots), pos=torch.tensor(positions),
                           input_ids=torch.tensor(input_ids))


def test_v2_maps_rows_to_slots_through_the_context(setup):
    states = ReqStates()
    p = CaliberLogitsProcessorV2(vllm_config(), states)
    assert p.add_request(2, params(setup, 2)) is True
    assert p.add_request(0, params(setup, 0)) is True
    states.fill(2, [1, 4, 6, 8])      # prompt [1, 4, 6] and one output token
    states.fill(0, [1, 9])
    p.apply_staged_writes()
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, K, generator=gen)
    # rows in another order than the slots: row 0 is slot 2, row 1 is slot 0
    served = p.apply(logits.clone(), ctx([2, 0], [3, 1], [8, 9]))
    assert torch.equal(served[0], expected_row(setup, logits[0], 2, [1, 4, 6], [8]))
    assert torch.equal(served[1], logits[1])
    # the next step: slot 2 grew by one token, rows swapped
    states.fill(2, [1, 4, 6, 8, 11])
    logits = torch.randn(2, K, generator=gen)
    served = p.apply(logits.clone(), ctx([0, 2], [1, 4], [9, 11]))
    assert torch.equal(served[1], expected_row(setup, logits[1], 2, [1, 4, 6, 8], [11]))
    assert torch.equal(served[0], logits[0])


def test_v2_speculative_rows_each_get_their_own_context(setup):
    states = ReqStates()
    p = CaliberLogitsProcessorV2(vllm_config(), states)
    p.add_request(1, params(setup, 1))
    states.fill(1, [1, 3, 5])  # committed; this step feeds the last committed token and two drafts
    logits = torch.randn(3, K, generator=torch.Generator().manual_seed(3))
    served = p.apply(logits.clone(), ctx([1, 1, 1], [2, 3, 4], [5, 17, 19]))
    for row, context in enumerate(([1, 3, 5], [1, 3, 5, 17], [1, 3, 5, 17, 19])):
        assert torch.equal(served[row], expected_row(setup, logits[row], 1, context, []))


def test_v2_a_recycled_slot_is_reset_and_an_unknown_slot_is_not_clean(setup):
    states = ReqStates()
    p = CaliberLogitsProcessorV2(vllm_config(), states)
    p.add_request(0, params(setup, 3))
    states.fill(0, [1, 2, 3, 4, 5])
    p.apply(torch.zeros(1, K), ctx([0], [4], [5]))
    p.add_request(0, params(setup, 0))  # a new request in the recycled slot, with a shorter history
    states.fill(0, [1, 7])
    logits = torch.randn(2, K, generator=torch.Generator().manual_seed(4))
    served = p.apply(logits.clone(), ctx([0, 3], [1, 0], [7, 1]))
    assert torch.equal(served[0], logits[0])
    assert float((served[1] - logits[1]).std()) > 1.0  # slot 3 was never added: the top level


def test_the_module_imports_without_vllm():
    assert caliber_vllm.TOKEN_ARG == "caliber"
    assert caliber_vllm.PROCESSED_MODES == ("processed_logprobs", "processed_logits")
