"""Full-vocabulary dumps streamed a block at a time: bounds against the exact full rows, every format, limits."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest

from caliber_core.calibration.full_vocab import config_for_vocab_file, reduce_file, sigma_for_agreement
from caliber_core.calibration.gap_histogram import ReducedRows, agreement_bounds, bin_edges, reduce_block
from caliber_core.cli import EXIT_USER_ERROR, main
from caliber_core.config import load_config
from caliber_core.loading import LogitsFileError
from caliber_core.loading.row_stream import open_rows
from caliber_core.simulation.llm_like import exact_agreement, llm_like_logits

V = 16_384


@pytest.fixture(scope="module")
def logits():
    return llm_like_logits(32, V, seed=7, dtype=np.float32)


def reduced_of(x, m=32):
    g, c = reduce_block(np.array(x, dtype=np.float32), m=m)
    return ReducedRows(g, c, x.shape[1])


def test_bin_edges_bracket_every_gap_they_count(logits):
    lower, upper = bin_edges()
    red = reduced_of(logits)
    assert red.counts.sum(axis=1).tolist() == [V - 1 - 32] * len(logits)
    gaps = np.sort(logits.max(axis=1, keepdims=True) - logits, axis=1)[:, 1:]
    np.testing.assert_allclose(red.top_gaps, gaps[:, :32].astype(np.float64))
    tail = gaps[:, 32:].astype(np.float32)
    for i in range(3):
        idx = np.searchsorted(upper, tail[i], side="right")
        assert np.all(lower[idx] <= tail[i]) and np.all(tail[i] < upper[idx])
        np.testing.assert_array_equal(np.bincount(idx, minlength=len(lower)), red.counts[i])


def test_reduced_bounds_contain_the_exact_full_vocabulary_agreement(logits):
    red = reduced_of(logits)
    for sigma in (0.2, 0.6, 1.2, 2.5, 5.0):
        lo, hi = agreement_bounds(red, sigma)
        truth = exact_agreement(logits.astype(np.float64), sigma, step=0.2)
        assert np.all(lo <= truth + 1e-9) and np.all(truth <= hi + 1e-9), sigma
        if truth.mean() >= 0.8:  # where targets are served, the bin edges leave a tiny gap
            assert hi.mean() - lo.mean() < 1e-4


def test_the_served_sigma_is_within_0_02_percent_of_the_exact_sigma(logits):
    from scipy.optimize import brentq

    red = reduced_of(logits)
    full = logits.astype(np.float64)
    for target in (0.9, 0.8):
        sigma = sigma_for_agreement(red, target)
        exact = brentq(lambda s: exact_agreement(full, s, step=0.2).mean() - target, sigma * 0.99, sigma * 1.01,
                       rtol=1e-7)
        assert abs(sigma - exact) / exact < 2e-4
        top20 = ReducedRows(red.top_gaps[:, :20], np.zeros_like(red.counts), V)
        assert abs(sigma_for_agreement(top20, target) - exact) / exact > abs(sigma - exact) / exact


def write_safetensors(path, array_bytes, shape, dtype, name="lm"):
    header = {"__metadata__": {"name": name},
              "logits": {"dtype": dtype, "shape": list(shape), "data_offsets": [0, len(array_bytes)]}}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + array_bytes)


def bf16_bytes(x):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + 0x8000) >> 16).astype(np.uint16).tobytes()  # round to nearest


def test_every_format_and_dtype_streams_the_same_rows(logits, tmp_path):
    import torch

    x = logits[:20]
    np.save(tmp_path / "a.npy", x)
    np.save(tmp_path / "h.npy", x.astype(np.float16))
    write_safetensors(tmp_path / "b.safetensors", bf16_bytes(x), x.shape, "BF16")
    as_bf16 = torch.from_numpy(x.copy()).to(torch.bfloat16)
    torch.save({"logits": as_bf16, "name": "pt-model"}, tmp_path / "c.pt")
    torch.save(torch.from_numpy(x.copy()), tmp_path / "d.pt")
    bf = (np.frombuffer(bf16_bytes(x), np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(x.shape)
    np.savez(tmp_path / "e.npz", labels=np.arange(20), logits=x)  # stored: streamed in place
    np.savez_compressed(tmp_path / "f.npz", logits=x)  # compressed: inflated block by block
    expect = {"a.npy": x, "h.npy": x.astype(np.float16).astype(np.float32), "b.safetensors": bf,
              "c.pt": as_bf16.float().numpy(), "d.pt": x, "e.npz": x, "f.npz": x}
    for name, want in expect.items():
        src = open_rows(tmp_path / name)
        got = np.concatenate([b.copy() for _, b in src.blocks(block_bytes=7 * V * src.itemsize)])
        np.testing.assert_array_equal(got, want, err_msg=name)
        red, _, sha = reduce_file(tmp_path / name)
        assert sha == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        np.testing.assert_allclose(red.top_gaps, reduced_of(want).top_gaps)
    assert open_rows(tmp_path / "b.safetensors").name == "lm" and open_rows(tmp_path / "c.pt").name == "pt-model"


def test_cli_streams_a_large_vocabulary_to_agreement_targets(logits, tmp_path, capsys):
    path = tmp_path / "vocab.npy"
    np.save(path, logits)
    out = tmp_path / "cfg.json"
    code = main(["calibrate", str(path), "--agreement", "0.9", "0.8", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    assert "full vocabulary streamed (V=16384" in stdout
    config = load_config(out)
    assert config["n_classes"] == V and config["bounds"]["k"] == 32
    for t in config["targets"]:
        lo, hi = t["interval"]["agreement"]
        assert lo - 1e-5 <= t["requested"] <= hi + 1e-5 and hi - lo < 1e-4  # sigma within 1e-5 of the root
    code = main(["calibrate", str(path), "--retention", "0.9"])
    _, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR and "only --agreement targets apply" in err


def test_bad_files_and_the_element_limit_are_refused(logits, tmp_path):
    path = tmp_path / "v.npy"
    np.save(path, logits)
    with pytest.raises(LogitsFileError, match=r"reduce to 42,048 numbers, more than max_elements=10,000"):
        reduce_file(path, max_elements=10_000)
    cut = tmp_path / "cut.npy"
    cut.write_bytes(path.read_bytes()[: -V * 4])
    with pytest.raises(LogitsFileError, match="truncated"):
        open_rows(cut)
    bad = logits.copy()
    bad[5, 17] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    with pytest.raises(LogitsFileError, match="row 5 holds NaN"):
        reduce_file(tmp_path / "nan.npy")
    np.save(tmp_path / "f.npy", np.asfortranarray(logits))
    with pytest.raises(LogitsFileError, match="column-major"):
        open_rows(tmp_path / "f.npy")
    np.save(tmp_path / "i.npy", logits.astype(np.int32))
    with pytest.raises(LogitsFileError, match="dtype int32"):
        open_rows(tmp_path / "i.npy")
    with pytest.raises(ValueError, match="only --agreement targets apply"):
        config_for_vocab_file(path, [("retention", 0.9)])


# -- labelled files: accuracy and retention from the same reduction ----------------------------------------


def labelled(n, k, seed):
    """Standard-normal logits with the label's raised by 2.5 (the shape bench_memory writes), a tie and a kept label."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, k), dtype=np.float32)
    y = rng.integers(0, k, n)
    z[np.arange(n), y] += 2.5
    z[1, y[1]] = z[1].max()  # a tie at the top: correct only if the label's column comes first
    z[2, y[2]] = np.sort(z[2])[-6]  # a label among the kept gaps
    return z, y


def reduced_with_labels(z, y, m=32):
    g, c, h, slots = reduce_block(np.array(z, dtype=np.float32), m=m, labels=y)
    return ReducedRows(g, c, z.shape[1], h, slots)


def test_labelled_bounds_contain_the_exact_accuracy_and_agreement_rows():
    from caliber_core.calibration.gap_histogram import LABEL_BINNED, LABEL_IS_TOP, row_bounds
    from caliber_core.calibration.survival import sorted_gaps, survival_probability

    z, y = labelled(40, 3000, seed=1)
    red = reduced_with_labels(z, y)
    full = z.astype(np.float64)
    pred = full.argmax(axis=1)
    np.testing.assert_array_equal(red.correct, pred == y)
    assert red.label_slots[2] >= 0 and (red.label_slots == LABEL_BINNED).any()
    # The label's gap left the histogram: every class is counted once, top and label apart.
    binned = red.label_slots == LABEL_BINNED
    assert np.all(red.counts.sum(axis=1) == 3000 - 1 - 32 - binned)
    for sigma in (0.05, 0.15, 0.3, 0.6, 1.2):
        b = row_bounds(red, sigma)
        agree = survival_probability(sorted_gaps(full, pred), sigma)
        acc = survival_probability(sorted_gaps(full, y), sigma)
        assert np.all(b.agree_lo <= agree + 1e-9) and np.all(agree <= b.agree_hi + 1e-9), sigma
        assert np.all(b.acc_lo <= acc + 1e-9) and np.all(acc <= b.acc_hi + 1e-9), sigma
        np.testing.assert_array_equal(b.acc_lo[red.label_slots == LABEL_IS_TOP], b.agree_lo[red.correct])
        only = row_bounds(red, sigma, agreement=False)  # the accuracy rows alone: the same bounds (float32 tail sums)
        np.testing.assert_allclose(only.acc_lo, b.acc_lo, rtol=1e-6, atol=1e-13)
        np.testing.assert_allclose(only.acc_hi, b.acc_hi, rtol=1e-6, atol=1e-13)
        assert abs(0.5 * (b.acc_lo + b.acc_hi).mean() - acc.mean()) < 2e-4 * max(acc.mean(), 1e-3)


def test_retention_at_the_served_sigma_matches_an_independent_monte_carlo():
    """10^6 plain argmax draws at each served sigma: retention within 0.5% (MARE), the draws' error far below."""
    from caliber_core.calibration.full_vocab import config_for_full_vocab

    z, y = labelled(200, 96, seed=5)
    z[:, :] *= 1.0
    red = reduced_with_labels(z, y)
    records, config = config_for_full_vocab(red, [("retention", 0.9), ("retention", 0.7), ("accuracy", 0.3)],
                                            name="t")
    a0 = config["clean_accuracy"]
    assert a0 == pytest.approx(np.mean(z.argmax(axis=1) == y))
    rng = np.random.default_rng(11)
    draws = 5_000  # per row: 10^6 in all
    errors = []
    for r in records:
        hits = 0
        for _ in range(draws // 250):
            noisy = z[None, :, :] + r.sigma * rng.standard_normal((250, *z.shape), dtype=np.float32)
            hits += int(np.sum(noisy.argmax(axis=2) == y[None, :]))
        truth = hits / (draws * z.shape[0]) / a0
        se = np.sqrt(truth * a0 * (1 - truth * a0) / (draws * z.shape[0])) / a0
        assert se / truth < 0.002  # the truth is sharp enough to judge 0.5%
        errors.append(abs(r.retention - truth) / truth)
        lo, hi = r.interval["retention"]
        assert hi - lo < 1e-3
    assert np.mean(errors) < 0.005, errors


def test_labelled_large_vocabulary_in_every_form_matches_the_exact_engine(tmp_path, capsys):
    from caliber_core.calibration.engine import CurveEngine

    k = 8192
    z, y = labelled(24, k, seed=3)
    np.savez(tmp_path / "both.npz", logits=z, labels=y)
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "y.npy", y)
    write_safetensors(tmp_path / "z.safetensors", z.tobytes(), z.shape, "F32")
    runs = {"both.npz": [], "z.npy": ["--labels", str(tmp_path / "y.npy")],
            "z.safetensors": ["--labels", str(tmp_path / "y.npy")]}
    sigmas = {}
    for name, extra in runs.items():
        out = tmp_path / f"{name}.json"
        code = main(["calibrate", str(tmp_path / name), *extra, "--retention", "0.9", "0.7",
                     "--target-accuracy", "0.08", "--out", str(out), "--quiet"])
        _, err = capsys.readouterr()
        assert code == 0, err
        config = load_config(out)
        assert config["n_classes"] == k and config["clean_accuracy"] == pytest.approx(np.mean(z.argmax(1) == y))
        sigmas[name] = [t["sigma"] for t in config["targets"]]
    assert sigmas["both.npz"] == sigmas["z.npy"] == sigmas["z.safetensors"]
    engine = CurveEngine(z.astype(np.float64), y, method="exact")
    a0 = engine.sample.clean_accuracy
    for t in config["targets"]:
        exact = float(engine.accuracy(t["sigma"])[0])
        assert abs(exact - t["accuracy"]) < 1e-6 + 1e-4 * t["accuracy"], t
        lo, hi = t["interval"]["accuracy"]
        assert lo - 1e-9 <= exact <= hi + 1e-9
        assert t["retention"] == pytest.approx(t["accuracy"] / a0)


def test_labelled_bad_input_is_refused_with_the_row(tmp_path, capsys):
    k = 8192
    z, y = labelled(12, k, seed=4)
    np.save(tmp_path / "z.npy", z)
    bad = y.copy()
    bad[7] = k
    np.save(tmp_path / "bad.npy", bad)
    np.save(tmp_path / "short.npy", y[:5])
    for labels, message in (("bad.npy", "labels index 7 is 8192, outside [0, 8192)"),
                            ("short.npy", "labels have 5 entries but the logits")):
        code = main(["calibrate", str(tmp_path / "z.npy"), "--labels", str(tmp_path / labels), "--retention", "0.9"])
        _, err = capsys.readouterr()
        assert code == EXIT_USER_ERROR and message in err and len(err.strip().splitlines()) == 1
    nan = z.copy()
    nan[9, 3] = np.nan
    np.savez(tmp_path / "nan.npz", logits=nan, labels=y)
    code = main(["calibrate", str(tmp_path / "nan.npz"), "--retention", "0.9"])
    _, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR and "row 9 holds NaN" in err
    code = main(["calibrate", str(tmp_path / "z.npy"), "--labels", str(tmp_path / "short.npy"),
                 "--retention", "0.9", "--max-elements", "1000"])
    _, err = capsys.readouterr()
    assert code == EXIT_USER_ERROR and "max_elements=1,000" in err
