"""What averaging jittered copies of one input gains a thief, by how the endpoint seeds its noise.

For each of ``--inputs`` random inputs, ``--variants`` copies are sent (each
feature moved one ulp up, down or kept; zeros sent as +0.0 or -0.0) by a
flagged account, and the answers are averaged. The figure is

    ratio = RMS(mean of the answers - clean logits) / RMS(one answer - clean logits)

1 means averaging gained nothing; 1/sqrt(variants) is what independent draws give.
Three endpoints, each the FastAPI example's ``create_app`` and ``linear_model``
behind a real ``Throttle`` (configs calibrated by the CLI on the bundled digits logits):

* per-input seeding, ids from the raw float64 bytes of each row (the example before canonical ids);
* per-input seeding, canonical ids (``caliber_core.serving.canonical_ids``, 6 decimals);
* consistent seeding (no ids).

Writes docs/figures/throttle-jitter.md (through ``figure_files``: the date, the machine and this command).
Usage: python benchmarks/bench_jitter.py [--inputs 20] [--variants 64]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from caliber_core.cli import main as cli  # noqa: E402
from caliber_core.serving import canonical_features  # noqa: E402
from caliber_core.serving.keys import read_key_file  # noqa: E402
from caliber_core.throttle import Throttle  # noqa: E402
from examples.serve_fastapi import create_app, linear_model  # noqa: E402
from figure_files import FigureFile  # noqa: E402  (benchmarks/ is this script's folder)

N_FEATURES = 16


def jittered(x: np.ndarray, n: int, rng) -> np.ndarray:
    out = np.repeat(x[None, :], n, axis=0)
    step = rng.integers(-1, 2, size=out.shape)
    out = np.where(step > 0, np.nextafter(out, np.inf), np.where(step < 0, np.nextafter(out, -np.inf), out))
    zeros = x == 0
    out[:, zeros] = np.where(rng.random(size=(n, int(zeros.sum()))) < 0.5, -0.0, 0.0)
    return out


def ratio(answers: np.ndarray, clean: np.ndarray) -> float:
    one = np.sqrt(np.mean((answers[0] - clean) ** 2))
    return float(np.sqrt(np.mean((answers.mean(axis=0) - clean) ** 2)) / one)


def calibrate(folder: Path, key_file: Path, *, consistent: bool) -> Path:
    out = folder / ("consistent.json" if consistent else "per-input.json")
    extra = ["--seeding", "consistent", "--key-file", str(key_file)] if consistent else []
    subprocess.run([sys.executable, "-m", "caliber_core", "calibrate", str(ROOT / "data" / "digits_mlp-wide.npz"),
                    "--retention", "0.8", "--out", str(out), "--quiet", *extra], cwd=ROOT, check=True,
                   env=os.environ | {"PYTHONPATH": str(ROOT)})
    policy = folder / (out.stem + ".policy.json")
    assert cli(["throttle", "init", str(out), "--levels", "0", "--escalate-after", "1000000000",
                "--out", str(policy), "--key-file", str(key_file)]) == 0
    return policy


def run(args) -> list[tuple[str, list[float]]]:
    rng = np.random.default_rng(args.seed)
    model = linear_model(N_FEATURES, 10)
    inputs = rng.normal(scale=2.0, size=(args.inputs, N_FEATURES))
    inputs[:, :2] = 0.0  # two zero features in every input: +-0.0 variants
    rows = []
    with tempfile.TemporaryDirectory(prefix="caliber-jitter-") as tmp:
        folder = Path(tmp)
        key_file = folder / "caliber.key"
        assert cli(["keygen", "--out", str(key_file)]) == 0
        key = read_key_file(key_file)
        for label, consistent, raw in (("per-input, ids from raw float64 bytes", False, True),
                                       ("per-input, canonical ids (6 decimals)", False, False),
                                       ("consistent", True, False)):
            policy = calibrate(folder, key_file, consistent=consistent)
            throttle = Throttle.from_files(policy, key=key, store=f"sqlite:///{folder / (policy.stem + '.db')}",
                                           metrics=False)
            throttle.flag("thief", level=1)
            client = TestClient(create_app(throttle, model))
            ratios = []
            for x in inputs:
                variants = jittered(x, args.variants, rng)
                if raw:
                    logits = model(variants)
                    ids = [hashlib.sha256(v.tobytes()).digest() for v in np.ascontiguousarray(variants)]
                    answers = np.asarray(throttle.respond("thief", logits, ids).logits)
                    clean = model(x[None, :])[0]
                else:
                    answers = np.array([client.post("/v1/classify", json={"inputs": [v.tolist()]},
                                                    headers={"Authorization": "Bearer thief"}).json()["logits"][0]
                                        for v in variants])
                    clean = model(canonical_features(x, decimals=6))[0]
                ratios.append(ratio(answers, clean))
            throttle.close()
            rows.append((label, ratios))
            print(f"{label}: ratio mean {np.mean(ratios):.3f} [min {np.min(ratios):.3f}, max {np.max(ratios):.3f}]",
                  flush=True)
    return rows


def write_figure(rows, args) -> None:
    fig = FigureFile("throttle-jitter", "What averaging jittered copies of one input gains, by endpoint")
    fig.note(f"{args.variants} jittered copies of each of {args.inputs} inputs (one ulp up or down per feature, "
             f"+-0.0 for zeros), sent by a flagged account to the FastAPI example and averaged. Ratio = RMS error "
             f"of the average / RMS error of one answer, against the clean logits: 1 means averaging gains "
             f"nothing; independent draws give 1/sqrt({args.variants}) = {1 / np.sqrt(args.variants):.3f}.")
    fig.table(["endpoint", "ratio, mean over inputs", "min", "max"],
              [[label, f"{np.mean(r):.3f}", f"{np.min(r):.3f}", f"{np.max(r):.3f}"] for label, r in rows])
    fig.write()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=20)
    ap.add_argument("--variants", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    write_figure(run(args), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
