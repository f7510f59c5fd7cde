"""Where a vision model's directory keeps its image processor's config."""

import json
from pathlib import Path


def image_processor_config(model_dir: Path) -> dict:
    """The image processor's config: preprocessor_config.json (as the Hub's checkpoints ship
    it), or the ``image_processor`` of processor_config.json (as transformers 5 saves it); empty
    when there is neither."""
    for name, key in (
        ("preprocessor_config.json", None),
        ("processor_config.json", "image_processor"),
    ):
        path = model_dir / name
        if path.is_file():
            saved = json.loads(path.read_text())
            if key is None or key in saved:
                return saved if key is None else saved[key]
    return {}


def video_processor_config(model_dir: Path) -> dict:
    """The video processor's config, where transformers looks for it: processor_config.json's
    ``video_processor``, video_preprocessor_config.json, else the image processor's
    preprocessor_config.json; empty when there is none."""
    nested = model_dir / "processor_config.json"
    if nested.is_file() and "video_processor" in (saved := json.loads(nested.read_text())):
        return saved["video_processor"]
    for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
        if (model_dir / name).is_file():
            return json.loads((model_dir / name).read_text())
    return {}


def pixel_scaling(processor: dict) -> dict:
    """The `VisionConfig` fields of an image processor's resampling and scaling: ``resample``,
    ``rescale_factor``, ``image_mean`` and ``image_std`` (its config's, over the defaults it
    holds)."""
    return {
        "resample": processor["resample"],
        "rescale_factor": processor["rescale_factor"],
        "image_mean": tuple(processor["image_mean"]),
        "image_std": tuple(processor["image_std"]),
    }
