"""Caliber's noise inside vLLM: logits processors that serve each request the level its grant token names.

Loaded by vLLM, with the policy and key taken from the environment::

    CALIBER_POLICY=policy.json CALIBER_KEY_FILE=caliber.key \\
    vllm serve MODEL --logprobs-mode processed_logprobs \\
        --logits-processors caliber_core.serving.vllm:CaliberLogitsProcessor

or offline, ``LLM(model, logits_processors=[CaliberLogitsProcessor],
logprobs_mode="processed_logprobs")`` with ``SamplingParams(extra_args=
{"caliber": token})``.

* :class:`CaliberLogitsProcessor` -- vLLM's V1 interface (the V1 model runner,
  which vLLM's CPU build uses);
* :class:`CaliberLogitsProcessorV2` -- Model Runner V2's interface (vLLM's
  default wherever Triton has a backend, e.g. CUDA).

Both are thin: they track which request sits in which row and hand the batch
to :class:`caliber_core.serving.engine_rows.BatchNoise`, the engine-free core
that the throttle and the Perturber share (a row at level j gets exactly
``Perturber.from_config(config, target=I_j, key=key).perturb(row, [id])``
with ``id = position_id(prompt_token_ids, output_token_ids)``).

What they refuse:

* to start, unless the engine returns processed logprobs
  (``--logprobs-mode processed_logprobs`` or ``processed_logits``): under the
  default ``raw_logprobs`` vLLM returns the logprobs from before any processor,
  so a flagged account would get clean ones while the noise looked active;
* to start, when ``CALIBER_POLICY`` or ``CALIBER_KEY_FILE`` is unset or
  unreadable, or the model's vocabulary is not the config's K;
* any request without a valid grant token in ``extra_args["caliber"]`` (made
  by ``Throttle.grant``): ``validate_params`` raises, and vLLM answers HTTP 400.

vLLM is imported only here, and only if installed: without it the classes
still exist (for engine-free tests) on a plain ``object`` base.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading

from ..throttle.grants import GrantError
from .engine_rows import BatchNoise, PositionHasher, position_id

__all__ = ["POLICY_ENV", "KEY_FILE_ENV", "TOKEN_ARG", "PROCESSED_MODES", "CaliberLogitsProcessor",
           "CaliberLogitsProcessorV2", "core_from_environment", "position_id"]

#: The environment variables vLLM's processes read the policy and key from.
POLICY_ENV, KEY_FILE_ENV = "CALIBER_POLICY", "CALIBER_KEY_FILE"
#: The per-request argument carrying the grant token (REST: ``"vllm_xargs": {"caliber": token}``).
TOKEN_ARG = "caliber"
#: Logprobs modes whose returned logprobs are taken after the logits processors.
PROCESSED_MODES = ("processed_logprobs", "processed_logits")

_log = logging.getLogger(__name__)

try:  # vLLM is optional: the engine-free tests build these classes on plain objects
    from vllm.v1.sample.logits_processor import LogitsProcessor as _V1Base
except ImportError:  # pragma: no cover - depends on the environment
    _V1Base = object
try:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as _V2Base
except ImportError:  # pragma: no cover - depends on the environment
    _V2Base = object


class CaliberSetupError(RuntimeError):
    """The processor cannot serve: a missing setting, a wrong logprobs mode, a vocabulary of another size."""


_cores: dict = {}
_cores_lock = threading.Lock()


def core_from_environment(environ=None) -> BatchNoise:
    """The :class:`BatchNoise` for ``CALIBER_POLICY`` and ``CALIBER_KEY_FILE``, made once per process and pair.

    Parameters
    ----------
    environ : Mapping, optional
        Where the two variables are read (default ``os.environ``).

    Returns
    -------
    BatchNoise
        Cached per (policy path, key path) pair for the life of the process.

    Raises
    ------
    CaliberSetupError
        A variable unset, a policy or key file that does not load (the message
        names the variable and the file, never the key).
    """
    from ..serving.keys import read_key_file
    from ..throttle.policy import PolicyError, load_policy

    environ = os.environ if environ is None else environ
    policy_path, key_path = environ.get(POLICY_ENV), environ.get(KEY_FILE_ENV)
    for name, value in ((POLICY_ENV, policy_path), (KEY_FILE_ENV, key_path)):
        if not value:
            raise CaliberSetupError(f"{name} is not set: the Caliber logits processor needs the throttle's policy "
                                    f"({POLICY_ENV}) and key file ({KEY_FILE_ENV}) in vLLM's environment")
    with _cores_lock:
        core = _cores.get((policy_path, key_path))
        if core is None:
            try:
                policy = load_policy(policy_path)
            except PolicyError as exc:
                raise CaliberSetupError(f"{POLICY_ENV}={policy_path}: {exc}") from None
            try:
                key = read_key_file(key_path)
            except OSError as exc:
                raise CaliberSetupError(f"{KEY_FILE_ENV}={key_path}: cannot read the key ({exc.strerror})") from None
            except ValueError as exc:
                raise CaliberSetupError(f"{KEY_FILE_ENV}: {exc}") from None
            core = _cores[(policy_path, key_path)] = BatchNoise(policy, key=key)
        return core


def _token_of(sampling_params):
    extra = getattr(sampling_params, "extra_args", None)
    return extra.get(TOKEN_ARG) if isinstance(extra, dict) else None


def _validate(sampling_params) -> None:
    """Admission: a request's grant token must verify (GrantError, a ValueError, becomes vLLM's HTTP 400)."""
    core_from_environment().verify(_token_of(sampling_params))


def _check_engine(vllm_config, core: BatchNoise) -> None:
    """Refuse to start under a logprobs mode that returns clean logprobs, or a vocabulary other than K."""
    model_config = getattr(vllm_config, "model_config", None)
    mode = str(getattr(model_config, "logprobs_mode", "raw_logprobs"))
    mode = getattr(getattr(model_config, "logprobs_mode", None), "value", mode)
    if mode not in PROCESSED_MODES:
        raise CaliberSetupError(
            f"the Caliber logits processor needs --logprobs-mode processed_logprobs (or processed_logits), "
            f"got {mode!r}: under it vLLM returns logprobs from before the noise, clean ones for flagged accounts")
    vocab = model_config.get_vocab_size() if hasattr(model_config, "get_vocab_size") else None
    if vocab is not None and int(vocab) != core.n_classes:
        raise CaliberSetupError(f"the model's vocabulary has {vocab} tokens, but the policy's config was "
                                f"calibrated for n_classes={core.n_classes}: calibrate on this model's logits")


class _Slot:
    """One request's level and its position hasher (prompt hashed once, each new token once)."""

    __slots__ = ("level", "hasher", "output")

    def __init__(self, level: int, hasher: PositionHasher, output):
        self.level, self.hasher, self.output = level, hasher, output


def _admitted_level(core: BatchNoise, sampling_params) -> int:
    """The level a request entering the batch is served at.

    Its token was verified at admission; a request may wait in the queue
    past the token's expiry, so only the expiry is not checked again. A token
    that does not verify here (the engine was reached some other way) is
    served at the top level: never clean, and the engine keeps running.
    """
    try:
        return core.verify(_token_of(sampling_params), now=0.0).level
    except GrantError as exc:
        _log.error("Caliber: a request entered the batch without a valid grant token (%s); serving it at the "
                   "top level", exc)
        return core.policy.top


class CaliberLogitsProcessor(_V1Base):
    """vLLM V1 logits processor: each request's rows get its grant's level of Caliber noise.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's config (its logprobs mode and vocabulary are checked).
    device : torch.device
        Where the logits live (the noise is drawn there).
    is_pin_memory : bool
        Unused.

    Raises
    ------
    CaliberSetupError
        ``CALIBER_POLICY``/``CALIBER_KEY_FILE`` unset or unreadable, a logprobs
        mode other than processed_logprobs/processed_logits (the message names
        ``--logprobs-mode``), a vocabulary other than the config's K.

    Notes
    -----
    A row's id is :func:`position_id` of the request's prompt and output so
    far; the noise is the Perturber's for that id at the request's level
    (Eq. ``logits-noise``, nested levels). Every row makes the policy's top
    level's draws, so the time taken does not depend on the levels served.
    Requests are tracked through vLLM's batch updates: removals and additions
    (an addition overwrites its slot, in whichever order the two arrive) and
    moves (one-way and swaps).
    """

    def __init__(self, vllm_config, device=None, is_pin_memory: bool = False):
        self.core = core_from_environment()
        _check_engine(vllm_config, self.core)
        self.core.warm_up(device)
        self.slots: dict[int, _Slot] = {}

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Refuse a request whose ``extra_args["caliber"]`` is missing, malformed, forged, altered, expired or foreign.

        Parameters
        ----------
        sampling_params : vllm.SamplingParams
            The request's parameters; the grant token is in ``extra_args``.

        Raises
        ------
        GrantError
            A ValueError: vLLM answers HTTP 400 with its message.
        CaliberSetupError
            The front-end process lacks ``CALIBER_POLICY``/``CALIBER_KEY_FILE``
            (every request is refused).
        """
        _validate(sampling_params)

    def is_argmax_invariant(self) -> bool:
        """False: the noise can change the argmax, so greedy requests must pass through it too."""
        return False

    def update_state(self, batch_update) -> None:
        """Follow the batch: removed, added (an overwrite of its slot), then moved, as vLLM documents.

        Parameters
        ----------
        batch_update : vllm BatchUpdate or None
            The persistent batch's changes since the last step (None: no change).
            Each added request's level is read from its grant; a grant that does
            not verify here is served the top level (logged, never raised).
        """
        if batch_update is None:
            return
        added = {index for index, *_ in batch_update.added}
        for index in batch_update.removed:
            if index not in added:  # vLLM's own helper applies adds first: a slot re-filled now stays filled
                self.slots.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            self.slots[index] = _Slot(_admitted_level(self.core, params), _hasher(prompt_ids), output_ids)
        for a, b, direction in batch_update.moved:
            first, second = self.slots.pop(a, None), self.slots.pop(b, None)
            if first is not None:
                self.slots[b] = first
            if second is not None and getattr(direction, "name", direction) == "SWAP":
                self.slots[a] = second

    def apply(self, logits):
        """The batch's logits with each row's noise; level-0 rows unchanged, bit for bit.

        Parameters
        ----------
        logits : torch.Tensor of shape (n_rows, vocab_size)
            The batch's logits, one row per slot.

        Returns
        -------
        torch.Tensor of shape (n_rows, vocab_size)
            ``logits`` itself, each row noised in place at its request's level,
            seeded by its position id; a row never added is served the top level
            with a random id. A request that fails the checks raises before any row is written.

        Notes
        -----
        Eq. logits-noise at each row's level, per-input seeding of Proposition cost (ii).
        """
        n_rows = int(logits.shape[0])
        levels, ids = [], []
        top = self.core.policy.top
        for row in range(n_rows):
            slot = self.slots.get(row)
            if slot is None:  # a row this processor never saw added: never served clean
                levels.append(top)
                ids.append(secrets.token_bytes(32))
                continue
            levels.append(slot.level)
            ids.append(slot.hasher.id_after(slot.output))
        # In place, as vLLM's own processors work: no new (n_rows, V) tensor a step.
        return self.core.serve(logits, levels, ids, out=logits)


def _hasher(prompt_ids) -> PositionHasher:
    if prompt_ids is None:  # a prompt given as embeddings: no tokens to hash, so a per-request random id
        return PositionHasher([int.from_bytes(secrets.token_bytes(7), "little")])
    return PositionHasher(prompt_ids)


class CaliberLogitsProcessorV2(_V2Base):
    """Model Runner V2 logits processor sharing :class:`CaliberLogitsProcessor`'s core.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's config (its logprobs mode and vocabulary are checked).
    req_states : LogitsProcRequestState
        The runner's per-slot token history: ``all_token_ids`` (committed
        tokens, prompt first) and ``total_len``.

    Raises
    ------
    CaliberSetupError
        As :class:`CaliberLogitsProcessor`.

    Notes
    -----
    A row is not a request: ``apply`` maps rows to slots through
    ``ctx.expanded_idx_mapping``. The context of a row at position p is the
    slot's committed tokens up to p (and, under speculative decoding, the
    draft tokens fed at the slot's rows up to p), so its id equals
    :func:`position_id` of that context. Slots are recycled without a remove
    hook: ``add_request`` resets a slot fully.
    """

    def __init__(self, vllm_config, req_states):
        self.core = core_from_environment()
        _check_engine(vllm_config, self.core)
        self.core.warm_up(getattr(getattr(vllm_config, "device_config", None), "device", None))
        self.req_states = req_states
        self.levels: dict[int, int] = {}
        self.hashers: dict[int, tuple[PositionHasher, list]] = {}

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """As :meth:`CaliberLogitsProcessor.validate_params`.

        Parameters
        ----------
        sampling_params : vllm.SamplingParams
            The request's parameters.

        Raises
        ------
        GrantError
            The grant does not verify.
        CaliberSetupError
            The process lacks its settings.
        """
        _validate(sampling_params)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        """Read the request's grant and reset its slot.

        Parameters
        ----------
        req_idx : int
            The request's slot.
        sampling_params : vllm.SamplingParams
            The request's parameters, with the grant token.

        Returns
        -------
        bool
            True: every row gets the same work.

        Notes
        -----
        A grant that does not verify here is served the top level (logged, never raised).
        """
        self.levels[int(req_idx)] = _admitted_level(self.core, sampling_params)
        self.hashers[int(req_idx)] = (PositionHasher([]), [])
        return True

    def apply_staged_writes(self) -> None:
        """Nothing is staged: levels live on the host, and the tokens are read in :meth:`apply`."""

    def _committed(self, slot: int) -> tuple[PositionHasher, list]:
        """The slot's hasher and its committed tokens on the host, brought up to ``total_len``."""
        hasher, tokens = self.hashers.setdefault(slot, (PositionHasher([]), []))
        total = int(_tensor(self.req_states.total_len)[slot].item())
        if total < len(tokens):  # never for a slot reset by add_request; start over if it happens
            hasher, tokens = self.hashers[slot] = (PositionHasher([]), [])
        if total > len(tokens):
            tokens.extend(_tensor(self.req_states.all_token_ids)[slot, len(tokens):total].tolist())
        return hasher, tokens

    def apply(self, logits, ctx):
        """The rows' logits with each row's noise (rows mapped to slots through ``ctx.expanded_idx_mapping``).

        Parameters
        ----------
        logits : torch.Tensor of shape (n_rows, vocab_size)
            The step's logits; speculative decoding gives a slot several rows.
        ctx : object
            vLLM's step context: ``expanded_idx_mapping``, ``pos`` and ``input_ids`` per row.

        Returns
        -------
        torch.Tensor of shape (n_rows, vocab_size)
            Each row noised at its slot's level, seeded by the position id of its
            committed tokens and the drafts up to it; a row of a slot never added
            is served the top level with a random id.

        Notes
        -----
        Eq. logits-noise at each row's level.
        """
        slots = ctx.expanded_idx_mapping.tolist()
        positions = ctx.pos.tolist()
        fed = ctx.input_ids.tolist()
        top = self.core.policy.top
        levels, ids = [], []
        committed = {slot: self._committed(slot) for slot in set(slots) if slot in self.levels}
        for row, (slot, pos) in enumerate(zip(slots, positions)):
            if slot not in committed:  # never added: never served clean
                levels.append(top)
                ids.append(secrets.token_bytes(32))
                continue
            hasher, tokens = committed[slot]
            levels.append(self.levels[slot])
            if pos < len(tokens):  # the row's token is committed: its context is the tokens up to it
                ids.append(hasher.id_after(tokens) if pos + 1 == len(tokens) else position_id(tokens[:pos + 1], []))
            else:  # speculative rows: the committed tokens, then the drafts fed at this slot's rows up to pos
                drafts = sorted((p, t) for s, p, t in zip(slots, positions, fed) if s == slot and len(tokens) <= p <= pos)
                ids.append(hasher.id_after(tokens, extra=[t for _, t in drafts]))
        return self.core.serve(logits, levels, ids)


def _tensor(buffer):
    """A vLLM staged write buffer's device tensor (or a plain tensor): sliced there, only the slice is copied."""
    return getattr(buffer, "gpu", buffer)
