"""Consistent against per-input seeding: what a wrongly flagged user keeps, and what the strongest thief keeps.

    .venv/bin/python benchmarks/bench_consistent.py            # both teachers, 5 keys, length scales 1 2 4
    .venv/bin/python benchmarks/bench_consistent.py --quick    # the easy teacher, 1 key, length scale 1
    .venv/bin/python benchmarks/bench_consistent.py --cost     # serving cost per row against per-input seeding
    .venv/bin/python benchmarks/bench_consistent.py --ablation # centring on the calibration rows, or not

Teachers (built here, deterministically, from scikit-learn's digits as in
``bench_extraction.py``; never seen by the project's calibration before):

* **easy**: MLP 64-128-10 on 13 augmented copies of 797 images (A0 ~ 0.97);
* **harder**: MLP 64-64-10 that sees only 28 fixed pixels of each image (A0 ~ 0.76).

The thief's pool is 6 augmented copies of 500 other images (3,000 rows),
the held-out split 2 copies of the remaining 500. For each seeding it goes
through the serving path: ``calibrate`` (per-input: the usual curve;
consistent: this key's exact curve on the pool rows, with ``--key-file``),
then answers from ``Perturber.from_config``. It prints, at 75% teacher
retention:

* teacher retention on the held-out split (judged: within 0.03 of 0.75);
* the strongest attacker's retention of its clean-answer accuracy: the best
  over the recipes light, strong and the tuned attacker's three candidates,
  each plain and prior-corrected (:mod:`caliber_core.extraction.prior_correction`),
  mean over training seeds, and the spread over keys;
* near-duplicate averaging: 16 jittered copies of every pool image (pixel
  noise N(0, 0.5)), each answered by the teacher and the Perturber and
  averaged, against one answer per image.

Training is single-threaded torch; the full run takes a few minutes per teacher.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_extraction import _augment, _digits_split  # noqa: E402

RETENTION = 0.75
JITTER_COPIES = 16


def _teacher(x_train, y_train, *, hidden: int, steps: int, seed: int):
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    d = x_train.shape[1]
    net = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x_train / 16), torch.from_numpy(y_train)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xt), yt).backward()
        opt.step()

    def logits(x):
        with torch.no_grad():
            return net(torch.from_numpy(np.asarray(x, dtype=np.float32) / 16)).numpy().astype(np.float64)

    return logits


def build_teacher(kind: str, seed: int = 0):
    """(archive dict, teacher logits function) for the easy or the harder teacher."""
    x, y, train, pool, held, rng = _digits_split(seed)
    if kind == "easy":
        x_train = np.concatenate([x[train], _augment(x[train], 12, rng)])
        y_train = np.tile(y[train], 13)
        f = _teacher(x_train, y_train, hidden=128, steps=400, seed=seed)
    else:
        # The teacher sees 28 fixed pixels of the 64 (the thief sends whole images).
        mask = np.zeros(64, dtype=np.float32)
        mask[np.random.default_rng(5).choice(64, 28, replace=False)] = 1.0
        x_train = np.concatenate([x[train], _augment(x[train], 4, rng)]) * mask
        seen = _teacher(x_train.astype(np.float32), np.tile(y[train], 5), hidden=64, steps=300, seed=seed)

        def f(inputs):
            return seen(np.asarray(inputs) * mask)
    x_pool, y_pool = _augment(x[pool], 6, rng), np.tile(y[pool], 6)
    x_eval, y_eval = _augment(x[held], 2, rng), np.tile(y[held], 2)
    arch = dict(inputs=x_pool, logits=f(x_pool), labels=y_pool, heldout_inputs=x_eval,
                heldout_logits=f(x_eval), heldout_labels=y_eval, name=np.array(f"digits-{kind}-teacher"))
    return arch, f


def _cli(*args, cwd: Path) -> None:
    # Run in the work folder with relative names: the config records its source path, and the
    # per-input noise is bound to the config's digest, so a random folder name would redraw it.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "caliber_core", *map(str, args), "--quiet"], cwd=cwd,
                          capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed: {proc.stderr.strip()}")


def served(config_path, seeding, key, logits, ids):
    from caliber_core.serving.runtime import Perturber

    return Perturber.from_config(config_path, target=0, seeding=seeding, key=key).perturb(logits, ids)


def run_teacher(kind: str, *, keys: int, length_scales, seeds: int, workdir: Path) -> list[dict]:
    from caliber_core.extraction.answers import Answers
    from caliber_core.extraction.attacker import Request, Thief
    from caliber_core.extraction.recalibration import labelled_rows
    from caliber_core.extraction.recipes import LIGHT, STRONG, TUNED_CANDIDATES
    from caliber_core.serving.keys import read_key_file

    arch, teacher = build_teacher(kind)
    path = workdir / f"{kind}.npz"
    np.savez_compressed(path, **arch)
    z, y = arch["logits"], arch["labels"]
    ze, ye = arch["heldout_logits"], arch["heldout_labels"]
    a0e = float(np.mean(ze.argmax(1) == ye))
    print(f"\n== {kind} teacher: A0 {np.mean(z.argmax(1) == y):.3f} (pool), {a0e:.3f} (held out)")
    labelled = labelled_rows(y, per_class=10)
    thief = Thief(arch["inputs"], arch["heldout_inputs"], ye, ze.argmax(1), n_classes=10, processes=1,
                  labelled=(labelled, y[labelled]))
    recipes = (LIGHT, STRONG) + TUNED_CANDIDATES
    train_seeds = list(range(seeds))
    jitter_rng = np.random.default_rng(7)
    x_pool = arch["inputs"]
    jittered = [np.clip(x_pool + jitter_rng.normal(0, 0.5, x_pool.shape), 0, 16) for _ in range(JITTER_COPIES)]
    z_jit = [teacher(xj) for xj in jittered]

    def attack(answers: np.ndarray, tag: str) -> tuple[float, str, float, str]:
        """(strongest label-free accuracy, its attacker, strongest with 10 labels a class, its attacker)."""
        a = Answers(answers, None, 0.0, 1, tag, "soft")
        outs = thief.train([Request(a, r, s) for r in recipes for s in train_seeds])
        best, name, best_l, name_l = -1.0, "", -1.0, ""
        for i, r in enumerate(recipes):
            o = outs[i * seeds:(i + 1) * seeds]
            plain = float(np.mean([x.accuracy for x in o]))
            corr = float(np.mean([x.corrected_accuracy for x in o]))
            recal = float(np.mean([x.recalibrated_accuracy for x in o]))
            for value, label in ((plain, r.name), (corr, r.name + "+prior")):
                if value > best:
                    best, name = value, label
            for value, label in ((plain, r.name), (corr, r.name + "+prior"), (recal, r.name + "+matrix")):
                if value > best_l:
                    best_l, name_l = value, label
        return best, name, best_l, name_l

    clean, clean_name, clean_l, clean_name_l = attack(z, "clean")
    print(f"clean answers: strongest surrogate {clean:.4f} ({clean_name}); with 10 labels a class "
          f"{clean_l:.4f} ({clean_name_l})")
    rows = []
    configs = [("per-input", None)] + [("consistent", ls) for ls in length_scales]
    for seeding, ls in configs:
        for k in range(keys if seeding == "consistent" else min(keys, 2)):
            key_name = f"{kind}-{seeding}-{ls}-{k}.key"
            key_path = workdir / key_name
            if not key_path.exists():
                key_path.write_text(hashlib.sha256(f"{kind}-{seeding}-{ls}-{k}".encode()).hexdigest() + "\n")
                key_path.chmod(0o600)
            key = read_key_file(key_path)
            cfg = workdir / f"{kind}-{seeding}-{ls}-{k}.json"
            extra = ["--seeding", "consistent", "--key-file", key_name, "--length-scale", ls,
                     "--noise-id", f"bench-{kind}-{ls}-{k}"] if ls else []
            _cli("calibrate", path.name, "--retention", RETENTION, "--out", cfg.name, *extra, cwd=workdir)
            sigma = json.loads(cfg.read_text())["targets"][0]["sigma"]
            ids = [f"heldout-{i}" for i in range(len(ye))]
            held = served(cfg, seeding, key, ze, ids)
            t_ret = float(np.mean(held.argmax(1) == ye)) / a0e
            answers = served(cfg, seeding, key, z, [f"pool-{i}" for i in range(len(y))])
            acc, who, acc_l, who_l = attack(answers, f"{seeding}-{ls}-{k}")
            avg = np.mean([served(cfg, seeding, key, zj, [f"pool-{i}-copy-{c}" for i in range(len(y))])
                           for c, zj in enumerate(z_jit)], axis=0)
            acc16 = attack(avg, f"{seeding}-{ls}-{k}-dup16")[0]
            row = dict(teacher=kind, seeding=seeding, length_scale=ls, key=k, sigma=sigma, teacher_retention=t_ret,
                       thief_retention=acc / clean, attacker=who, dup16_retention=acc16 / clean,
                       labelled_retention=acc_l / clean_l, labelled_attacker=who_l)
            rows.append(row)
            print(f"{seeding:>10} l={ls!s:>4} key {k}: sigma {sigma:.3f}  teacher retention {t_ret:.3f}  "
                  f"thief retention {acc / clean:.3f} ({who})  16 near-duplicates averaged {acc16 / clean:.3f}  "
                  f"with 10 labels a class {acc_l / clean_l:.3f} ({who_l})",
                  flush=True)
    thief.close()
    return rows


def summarize(rows: list[dict]) -> None:
    print("\n== summary (mean [min, max] over keys)")
    groups = {}
    for r in rows:
        groups.setdefault((r["teacher"], r["seeding"], r["length_scale"]), []).append(r)
    for (kind, seeding, ls), rs in groups.items():
        def span(name):
            v = np.array([r[name] for r in rs])
            return f"{v.mean():.3f} [{v.min():.3f}, {v.max():.3f}]"
        gain = np.array([r["dup16_retention"] - r["thief_retention"] for r in rs])
        print(f"{kind:>6} {seeding:>10} l={ls!s:>4} ({len(rs)} keys): teacher {span('teacher_retention')}  "
              f"thief {span('thief_retention')}  with labels {span('labelled_retention')}  near-duplicate gain {100 * gain.mean():+.1f} points "
              f"[{100 * gain.min():+.1f}, {100 * gain.max():+.1f}]")


def _best_us(perturber, x, ids, repeats: int) -> float:
    perturber.perturb(x, ids)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        perturber.perturb(x, ids)
        best = min(best, time.perf_counter() - t0)
    return best / x.shape[0] * 1e6


def cost(repeats: int = 40) -> None:
    """Best-of-N microseconds per row, batch of 256, numpy float32, through Perturber.perturb.

    Per-input: a bare Perturber. Consistent: ``Perturber.from_config`` on a
    config calibrated here with ``calibrate --seeding consistent`` (500
    synthetic rows, retention 0.75), so the level machinery is included.
    """
    from caliber_core.serving.runtime import Perturber
    from caliber_core.serving.keys import read_key_file
    from caliber_core.simulation.synthetic import make_synthetic_logits
    from threadpoolctl import threadpool_info, threadpool_limits

    rng = np.random.default_rng(0)
    ids = [f"request-{i}" for i in range(256)]
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"BLAS threads by default: {[i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']}")
    print(f"{'':>7} {'BLAS threads as configured':^30}   {'BLAS limited to 1 thread':^30}")
    print(f"{'K':>7} " + "   ".join([f"{'per-input':>10} {'consistent':>11} {'ratio':>6}"] * 2)
          + f"   (us per row, best of {repeats}, batch 256)")
    with tempfile.TemporaryDirectory() as tmp:
        key_path = Path(tmp) / "k.key"
        key_path.write_text(hashlib.sha256(b"cost").hexdigest() + "\n")
        key_path.chmod(0o600)
        key = read_key_file(key_path)
        for k in (10, 1000, 50_000):
            logits, labels = make_synthetic_logits(500, k, seed=1)
            data = Path(tmp) / f"syn{k}.npz"
            np.savez(data, logits=logits, labels=labels)
            cfg = Path(tmp) / f"syn{k}.json"
            _cli("calibrate", data.name, "--retention", RETENTION, "--out", cfg.name, "--seeding", "consistent",
                 "--key-file", key_path.name, "--noise-id", "cost", cwd=Path(tmp))
            x = rng.normal(size=(256, k)).astype(np.float32)
            per_input = Perturber(1.0, key=key)
            consistent = Perturber.from_config(cfg, seeding="consistent", key=key)
            cells = []
            for threads in (None, 1):
                # numpy's BLAS threads (the consistent matmuls); per-input seeding uses none.
                with threadpool_limits(limits=threads, user_api="blas"):
                    times = [_best_us(p, x, ids, repeats if k < 50_000 else max(3, repeats // 5))
                             for p in (per_input, consistent)]
                cells.append(f"{times[0]:>10.1f} {times[1]:>11.1f} {times[1] / times[0]:>6.2f}")
            print(f"{k:>7} " + "   ".join(cells), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def ablation(*, keys: int, seeds: int, length_scales=(4.0, 8.0)) -> None:
    """Centring on the calibration rows against none (raw g scaled to unit RMS), easy teacher: is the class bias real?"""
    from caliber_core.calibration.keyed_curve import keyed_accuracy, solve_keyed
    from caliber_core.calibration.margins import margin_scale
    from caliber_core.extraction.answers import Answers
    from caliber_core.extraction.attacker import Request, Thief
    from caliber_core.extraction.recipes import LIGHT, STRONG, TUNED_CANDIDATES
    from caliber_core.serving.consistent_noise import Centring, ConsistentNoise

    arch, _ = build_teacher("easy")
    z, y, ze, ye = arch["logits"], arch["labels"], arch["heldout_logits"], arch["heldout_labels"]
    a0, a0e = float(np.mean(z.argmax(1) == y)), float(np.mean(ze.argmax(1) == ye))
    thief = Thief(arch["inputs"], arch["heldout_inputs"], ye, ze.argmax(1), n_classes=10, processes=1)
    recipes = (LIGHT, STRONG) + TUNED_CANDIDATES

    def best(answers, tag):
        outs = thief.train([Request(Answers(answers, None, 0.0, 1, tag, "soft"), r, s)
                            for r in recipes for s in range(seeds)])
        plain = max(np.mean([o.accuracy for o in outs[i * seeds:(i + 1) * seeds]]) for i in range(len(recipes)))
        prior = max(np.mean([o.corrected_accuracy for o in outs[i * seeds:(i + 1) * seeds]])
                    for i in range(len(recipes)))
        return float(plain), float(prior)

    clean = max(best(z, "clean"))
    print(f"\n== centring ablation, easy teacher: thief retention, plain KD / strongest with prior correction")
    for ls in length_scales:
        for k in range(keys):
            key = hashlib.sha256(f"ablation-{ls}-{k}".encode()).digest()
            raw = ConsistentNoise(key, binding=b"ablation", n_classes=10, scale=float(margin_scale(z)),
                                  length_scale=ls)
            centred = raw.centred_on(z)
            rms = float(np.sqrt(np.mean(raw(z) ** 2)))
            uncentred = raw.centred_on(z)
            uncentred.centring = Centring(np.zeros(raw.features), rms)
            for name, g in (("centred", centred), ("not centred", uncentred)):
                gz = g(z)
                solved = solve_keyed(z, y, gz, target=RETENTION * a0, bootstrap=0)
                t_ret = keyed_accuracy(ze, ye, g(ze), solved.sigma) / a0e
                bias = float(np.abs(gz.mean(axis=0)).max())
                plain, prior = best(z + solved.sigma * gz, f"abl-{ls}-{k}-{name}")
                print(f"l={ls:g} key {k} {name:>11}: largest class mean of g {bias:.2f}  teacher retention "
                      f"{t_ret:.3f}  thief plain {plain / clean:.3f}  with prior correction {max(plain, prior) / clean:.3f}",
                      flush=True)
    thief.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--cost", action="store_true", help="only the serving cost per row")
    parser.add_argument("--ablation", action="store_true", help="only the centring ablation (easy teacher)")
    parser.add_argument("--keys", type=int, default=5, help="keys per consistent configuration (per-input: 2)")
    parser.add_argument("--seeds", type=int, default=2, help="training seeds per attacker")
    parser.add_argument("--length-scale", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--teacher", choices=("easy", "harder"), nargs="+", default=["easy", "harder"])
    args = parser.parse_args(argv)
    if args.cost:
        cost()
        return
    if args.ablation:
        ablation(keys=args.keys, seeds=args.seeds)
        return
    if args.quick:
        args.keys, args.length_scale, args.teacher = 1, [1.0], ["easy"]
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.teacher:
            rows += run_teacher(kind, keys=args.keys, length_scales=args.length_scale, seeds=args.seeds,
                                workdir=Path(tmp))
    summarize(rows)
    print(f"\n{time.perf_counter() - t0:.0f} s, load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    from figure_files import figure_name, transcript

    with transcript(figure_name("consistent-seeding", "--quick", "--cost", "--ablation", "--teacher"), "Consistent against per-input seeding: teacher and thief retention over keys"):
        main()
