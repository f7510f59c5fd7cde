"""Converted checkpoints kept on disk, so a second start maps them instead of converting again.

A model file is converted once (GGUF dequantized or kept in blocks, HF shards cast to the dtype);
the result is written under ``<cache>/converted/<key>/``, keyed by a hash of the source files'
contents, the dtype, the quantization and this format's version, and memory-mapped on the next
start (``torch.load(mmap=True)``: no copy, pages read as the model touches them). The architecture
and the tokenizer are kept beside the weights as JSON. ``SPYGLASS_WEIGHT_CACHE=0`` turns it off.
"""

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import tokenizers
import torch
from gguf import GGMLQuantizationType

from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.models.image_tiles import ImageTiles
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.quantization import QuantizedWeight
from spyglass.core.models.timed_frames import TimedFrames
from spyglass.core.models.vision_config import VisionConfig
from spyglass.core.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# 2: the architecture JSON gained the model-family fields (windows, soft-caps, experts).
# 4: GGUF types the kernels do not multiply are kept as Q4_1 or Q8_0 blocks (`gguf_transcode`), not floats.
# 5: vision models: tiles, grids and their arch fields; LLaVA-NeXT tying read from the outer config.
# 6: Qwen2-VL's and Qwen2.5-VL's video fields.
# 7: Qwen3-VL's video fields (`TimedFrames`).
_FORMAT_VERSION = "7"
_WEIGHTS, _META = "weights.pt", "meta.json"


def enabled() -> bool:
    """Whether converted checkpoints are cached (``SPYGLASS_WEIGHT_CACHE=0`` disables it)."""
    return os.environ.get("SPYGLASS_WEIGHT_CACHE", "1") != "0"


def source_digest(source: Path, memo_dir: Path | None = None) -> str:
    """A content hash of a model file, or of every regular file in a model directory.

    With ``memo_dir``, a hash once computed is kept there under the files' identity (path, inode,
    size, modification and change times), so a second start does not read the whole file again
    (0.1 s for the default model's 98 MB); any write to a file changes its change time.
    """
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    memo = memo_dir / _identity(files) if memo_dir is not None else None
    if memo is not None and memo.is_file():
        return memo.read_text()
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(source) if source.is_dir() else path.name).encode())
        with path.open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            partial = memo.with_name(f".{memo.name}.{os.getpid()}")
            partial.write_text(digest.hexdigest())
            os.replace(partial, memo)
        except OSError as error:
            log.warning("could not keep the hash of %s in %s: %s", source, memo_dir, error)
    return digest.hexdigest()


def _identity(files: list[Path]) -> str:
    """A name for the current version of ``files``, from their metadata alone."""
    stats = [(path.resolve(), path.stat()) for path in files]
    described = "\n".join(
        f"{path}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
        for path, st in stats
    )
    return hashlib.sha256(described.encode()).hexdigest()[:32]


def cached_checkpoint(
    cache_root: Path, source: Path, options: str, convert: Callable[[], Checkpoint]
) -> Checkpoint:
    """The checkpoint converted from ``source`` with ``options`` (dtype, quantization): from the cache when it
    is there, else from ``convert()``, whose result is then stored for the next start."""
    digest = source_digest(source, memo_dir=cache_root / "digests")
    key = hashlib.sha256(f"{_FORMAT_VERSION}|{digest}|{options}".encode()).hexdigest()[:24]
    entry = cache_root / "converted" / key
    if (entry / _META).is_file():
        try:
            return _read(entry)
        except (OSError, ValueError, RuntimeError, KeyError) as error:
            log.warning(
                "the converted weights in %s are unreadable (%s); converting again", entry, error
            )
            shutil.rmtree(entry, ignore_errors=True)
    checkpoint = convert()
    try:
        _write(checkpoint, entry)
    except OSError as error:
        log.warning("could not cache the converted weights in %s: %s", entry, error)
    return checkpoint


def _write(checkpoint: Checkpoint, entry: Path) -> None:
    """Store ``checkpoint`` under ``entry`` atomically: a reader sees the whole entry or none of it."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".partial-"))
    try:
        # GGUF blocks are saved as their raw bytes, their block types beside them in the metadata.
        quantized = {
            name: int(w.qtype)
            for name, w in checkpoint.weights.items()
            if isinstance(w, QuantizedWeight)
        }
        tensors = {
            name: w.data if name in quantized else w for name, w in checkpoint.weights.items()
        }
        torch.save(tensors, scratch / _WEIGHTS)
        tokenizer = checkpoint.tokenizer
        meta = {
            "name": checkpoint.name,
            "arch": dataclasses.asdict(checkpoint.arch),
            "quantized": quantized,
            "tokenizer": {
                "backend": tokenizer.backend.to_str(),
                "chat_template": tokenizer.chat_template,
                "bos_token_id": tokenizer.bos_token_id,
                "eos_token_ids": list(tokenizer.eos_token_ids),
                "add_bos_token": tokenizer.add_bos_token,
            },
        }
        (scratch / _META).write_text(json.dumps(meta))
        os.replace(scratch, entry)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
        if not (entry / _META).is_file():  # else another process stored the same entry first
            raise


def _read(entry: Path) -> Checkpoint:
    meta = json.loads((entry / _META).read_text())
    # JSON turns the config's tuples into lists; its one dict (rope_scaling) may hold lists of its own.
    arch_fields = {name: tuple(v) if isinstance(v, list) else v for name, v in meta["arch"].items()}
    if arch_fields.get("vision") is not None:
        vision = {name: _tuples(v) for name, v in arch_fields["vision"].items()}
        if vision.get("timed_frames") is not None:
            vision["timed_frames"] = TimedFrames(
                **{name: _tuples(v) for name, v in vision["timed_frames"].items()}
            )
        if vision.get("tiles") is not None:
            vision["tiles"] = ImageTiles(
                **{name: _tuples(v) for name, v in vision["tiles"].items()}
            )
        arch_fields["vision"] = VisionConfig(**vision)
    saved = meta["tokenizer"]
    tokenizer = Tokenizer(
        tokenizers.Tokenizer.from_str(saved["backend"]),
        chat_template=saved["chat_template"],
        bos_token_id=saved["bos_token_id"],
        eos_token_ids=tuple(saved["eos_token_ids"]),
        add_bos_token=saved["add_bos_token"],
    )
    weights = torch.load(entry / _WEIGHTS, mmap=True, weights_only=True)
    for name, qtype in meta["quantized"].items():
        weights[name] = QuantizedWeight(weights[name], GGMLQuantizationType(qtype))
    return Checkpoint(meta["name"], ModelArchConfig(**arch_fields), weights, tokenizer)


def _tuples(value):
    """``value`` with JSON's lists (nested too) made tuples again, as the configs hold them."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
